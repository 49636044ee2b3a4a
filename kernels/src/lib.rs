//! gemtune-kernels: everything needed to turn (CUDA source, defines) into a
//! correct, running kernel, plus the CPU side that judges it.
//!
//! - `quant`: GGML block formats on the CPU (dequantize / quantize rows).
//! - `oracle`: plain scalar reference ops with f64 accumulation.
//!
//! This crate knows nothing of TOML files, CLIs or models: shapes are numbers.

pub mod oracle;
pub mod quant;
