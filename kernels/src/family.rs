//! The kernel-family abstraction: one `.cu` file, one Rust description that
//! validates defines against a problem, computes the launch geometry and
//! builds a checkable, timeable workload.

use crate::check::Tolerance;
use crate::compile::Arch;
use crate::defines::Defines;
use crate::gpu::{Gpu, GpuError};
use crate::quant::GgmlType;
use crate::source;
use crate::workload::Workload;
use serde::{Deserialize, Serialize};

/// out[m][n] = sum_k x[m][k] * W[n][k]: `m` tokens, `n` output features,
/// `k` input features, W stored as `wtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulProblem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: GgmlType,
}

/// A problem shape a family can run. Attention problems come later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    Matmul(MatmulProblem),
}

impl Problem {
    pub fn matmul(m: usize, n: usize, k: usize, wtype: GgmlType) -> Problem {
        Problem::Matmul(MatmulProblem { m, n, k, wtype })
    }
}

/// How a variant's output is judged (see DESIGN §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Contract {
    /// Identical bits to the CPU replay of the kernel's defined algorithm.
    Bitexact,
    /// Float rounding differences only (reassociated f32 sums).
    Fp,
    /// Quantized or reduced-precision operands: RMS bound plus a bounded
    /// share of outliers, and a tight check against the CPU replay.
    Approx,
}

/// What `validate` checks a variant against. From `Gpu::limits()` on a GPU,
/// or `DeviceLimits::for_arch` for compile-only runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub arch: Arch,
    /// Largest dynamic + static shared memory one block may use (opt-in).
    pub max_smem_per_block: u32,
    pub max_threads_per_block: u32,
    pub sm_count: u32,
    pub l2_bytes: u64,
}

impl DeviceLimits {
    /// Nominal limits of an architecture (no GPU needed).
    pub fn for_arch(arch: Arch) -> DeviceLimits {
        let (sm, l2) = match arch.0 {
            90.. => (132, 50 << 20),
            89 => (128, 72 << 20),
            80 => (108, 40 << 20),
            _ => (80, 6 << 20),
        };
        DeviceLimits {
            arch,
            max_smem_per_block: arch.max_smem_optin(),
            max_threads_per_block: 1024,
            sm_count: sm,
            l2_bytes: l2,
        }
    }
}

/// How to launch a variant on a problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// The `extern "C"` function to launch (a family may instantiate several
    /// in one module, e.g. one per token count).
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory bytes.
    pub dyn_smem: u32,
}

impl LaunchGeometry {
    pub fn threads(&self) -> u32 {
        self.block.0 * self.block.1 * self.block.2
    }
}

/// A kernel family. Implementations live in `families::*`.
pub trait Family: Sync {
    fn name(&self) -> &'static str;
    /// Base entry name; `LaunchGeometry::kernel` names the exact function.
    fn entry(&self) -> &'static str;
    /// File under `kernels/cuda/`.
    fn source_file(&self) -> &'static str;
    /// The macro names listed in the source's `Defines:` header block.
    fn declared_defines(&self) -> Vec<String> {
        source::source(self.source_file())
            .map(source::header_defines)
            .unwrap_or_default()
    }
    /// The architecture whose arch-specific feature set (`sm_XXa`, e.g.
    /// Hopper's wgmma) the source needs: it compiles for that target only,
    /// and `validate` rejects every other device. `None`: portable source.
    fn arch_specific(&self) -> Option<Arch> {
        None
    }
    /// Defines of the family's default (baseline-quality) variant for `wtype`.
    fn default_defines(&self, wtype: GgmlType) -> Defines;
    /// The contract a variant with these defines is held to.
    fn contract(&self, d: &Defines) -> Contract;
    /// A tolerance derived from the contract and the problem (the accumulation
    /// length K); spec files may override it.
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance;
    /// Rejects impossible points with a reason, else returns the geometry.
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String>;
    /// Seeded inputs on the GPU, the CPU reference, and the launch sequence.
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError>;
}

/// Every registered family.
pub fn families() -> Vec<&'static dyn Family> {
    vec![
        &crate::families::quantize_q8_1::QuantizeQ81,
        &crate::families::gemv::Gemv,
        &crate::families::mmq::Mmq,
        &crate::families::gemm_dq::GemmDq,
        &crate::families::gemm_wgmma::GemmWgmma,
    ]
}

/// A family by name.
pub fn family(name: &str) -> Option<&'static dyn Family> {
    families().into_iter().find(|f| f.name() == name)
}

/// Shared validation helpers.
pub(crate) fn matmul_of(p: &Problem) -> &MatmulProblem {
    match p {
        Problem::Matmul(mp) => mp,
    }
}

/// Checks that the WTYPE define matches the problem's weight type and that
/// the type is one the families implement.
pub(crate) fn check_wtype(d: &Defines, mp: &MatmulProblem) -> Result<WType, String> {
    let w = crate::defines::get_str(d, "WTYPE")?;
    let wt = match w.as_str() {
        "Q8_0" => WType::Q8_0,
        "Q4_0" => WType::Q4_0,
        other if other.eq_ignore_ascii_case("q8_0") || other.eq_ignore_ascii_case("q4_0") => {
            return Err(format!(
                "WTYPE={other}: write it in upper case ({}), the kernel compares macro names",
                other.to_ascii_uppercase()
            ))
        }
        other => return Err(format!("WTYPE={other}: only Q8_0 and Q4_0 are implemented")),
    };
    if wt.ggml() != mp.wtype {
        return Err(format!(
            "WTYPE={w} does not match the problem's weight type {}",
            mp.wtype.name()
        ));
    }
    if mp.k % 32 != 0 || mp.k == 0 {
        return Err(format!(
            "k={} is not a positive multiple of the 32-element block",
            mp.k
        ));
    }
    if mp.m == 0 || mp.n == 0 {
        return Err("m and n must be positive".into());
    }
    Ok(wt)
}

/// The WTYPE define value for a weight type ("Q8_0", "Q4_0": the macro
/// names the kernels compare against, upper case).
pub fn wtype_define(t: GgmlType) -> crate::defines::DefineValue {
    crate::defines::DefineValue::Str(t.name().to_ascii_uppercase())
}

/// The weight types the matmul families implement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WType {
    Q8_0,
    Q4_0,
}

impl WType {
    pub fn ggml(self) -> GgmlType {
        match self {
            WType::Q8_0 => GgmlType::Q8_0,
            WType::Q4_0 => GgmlType::Q4_0,
        }
    }
    /// Bytes of quants per 32-element block (scales apart).
    pub fn quant_bytes_per_block(self) -> usize {
        match self {
            WType::Q8_0 => 32,
            WType::Q4_0 => 16,
        }
    }
}

pub(crate) fn int_in(d: &Defines, name: &str, allowed: &[i64]) -> Result<i64, String> {
    let v = crate::defines::get_int(d, name)?;
    if !allowed.contains(&v) {
        return Err(format!("{name}={v} is not one of {allowed:?}"));
    }
    Ok(v)
}

pub(crate) fn int_range(d: &Defines, name: &str, lo: i64, hi: i64) -> Result<i64, String> {
    let v = crate::defines::get_int(d, name)?;
    if v < lo || v > hi {
        return Err(format!("{name}={v} is outside {lo}..={hi}"));
    }
    Ok(v)
}
