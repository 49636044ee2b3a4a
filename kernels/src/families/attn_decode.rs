//! `attn_decode`: 1..8 query tokens over a long cache, split-KV on tensor
//! cores with a combine (flash-decoding), or the scalar kernel; graph-safe
//! (the position comes from device memory). See kernels/cuda/attn_decode.cu
//! and `bind::attention`.

use super::attention;
use crate::check::Tolerance;
use crate::defines::{defines, Defines};
use crate::family::{
    attn_of, Contract, DeviceLimits, Family, LaunchGeometry, Problem, ProblemKind,
};
use crate::gpu::{Gpu, GpuError};
use crate::quant::GgmlType;
use crate::workload::Workload;

pub struct AttnDecode;

/// Query tokens a decode call takes at most.
pub const MAX_TOKENS: usize = 8;

impl Family for AttnDecode {
    fn name(&self) -> &'static str {
        "attn_decode"
    }
    fn entry(&self) -> &'static str {
        "attn_decode"
    }
    fn source_file(&self) -> &'static str {
        "attn_decode.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Attention
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("ALGO", 1i64),
            ("HEAD_DIM", 256),
            ("SCALAR_WARPS", 4),
            ("BQ", 16),
            ("BKV", 64),
            ("WD", 4),
            ("STAGES", 2),
            ("CP_ASYNC", 1),
            ("SPLITS", 0),
        ]);
        d.insert("KV_TYPE".into(), "F16".into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        attention::contract(d)
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        attention::tolerance(d, p)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let a = attn_of(p)?;
        if a.n_q > MAX_TOKENS {
            return Err(format!(
                "decode takes 1..={MAX_TOKENS} query tokens, not {}",
                a.n_q
            ));
        }
        let algo = attention::read(d, a, lim)?;
        let z = match &algo {
            attention::Algo::Mma(t) => attention::splits(d, t, a, lim)?,
            attention::Algo::Scalar { .. } => 1,
        };
        Ok(attention::geometry("attn_decode", &algo, a, z))
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        attention::workload(gpu, d, p, geo, seed, true)
    }
}
