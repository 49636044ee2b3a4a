//! gemtune-kernels: everything needed to turn (CUDA source, defines) into a
//! correct, running kernel, plus the CPU side that judges it.
//!
//! - `quant`: GGML block formats on the CPU (dequantize / quantize rows).
//! - `oracle`: plain scalar reference ops with f64 accumulation.
//! - `source`, `defines`, `compile`: embedded `.cu` sources, NVRTC options,
//!   cubin compilation with an on-disk cache and ptxas resource counts;
//!   `pool`: many compiles at once on worker threads.
//! - `problem`, `device`, `verdict`: problem shapes, the device a variant
//!   targets (arch, limits, launch geometry), and how outputs are judged.
//! - `kernel_family`, `families`, `family`: the family abstraction, the
//!   families (validation, geometry, workloads) and their registry.
//! - `bind`: the calling convention of every family.
//! - `gpu`, `check`, `timing`: the device wrapper, correctness checks,
//!   event timing in two cache regimes and bandwidth ceilings.
//! - `reference`: vendor-library (cuBLAS) reference rows, checked and timed
//!   like the variants.
//! - `clocks`: SM/memory clocks, temperature and power sampled through NVML
//!   during timing (read-only).
//!
//! This crate knows nothing of TOML files, CLIs or models: shapes are numbers.

pub mod bind;
pub mod check;
pub mod clocks;
pub mod compile;
pub mod cubin;
pub mod defines;
pub mod device;
pub mod families;
pub mod family;
pub mod gpu;
pub mod kernel_family;
pub mod oracle;
pub mod pool;
pub mod problem;
pub mod quant;
pub mod reference;
pub mod runtime;
pub mod source;
pub mod timing;
pub mod verdict;
pub mod workload;

pub use check::{check_variant, compare, CheckReport, Tolerance};
pub use compile::{
    compile, default_cache_dir, nvrtc_available, take_recoveries, Arch, CompileError,
    CompiledVariant, FunctionResources, Recoveries,
};
pub use defines::{DefineValue, Defines};
pub use family::{
    families, family, Contract, DeviceLimits, Family, LaunchGeometry, MatmulProblem, Problem,
};
pub use gpu::{DeviceInfo, Gpu, GpuError};
pub use pool::{compile_all, CompileJob, PoolReport};
pub use timing::{
    measure_ceilings, time_variant, time_workload, Ceilings, Launches, Regime, Timeable, Timing,
    TimingConfig,
};
pub use workload::OpKind;
