//! `attn_prefill`: attention of a prefill chunk over the layer's cache
//! (causal, optionally windowed), scalar or tensor-core flash kernel. See
//! kernels/cuda/attn_prefill.cu and `bind::attention`.

use super::attention::{self, Algo};
use crate::check::Tolerance;
use crate::compile::Arch;
use crate::defines::{defines, get_int, Defines};
use crate::family::{
    attn_of, Contract, DeviceLimits, Family, LaunchGeometry, Problem, ProblemKind,
};
use crate::gpu::{Gpu, GpuError};
use crate::quant::GgmlType;
use crate::workload::Workload;

pub struct AttnPrefill;

impl Family for AttnPrefill {
    fn name(&self) -> &'static str {
        "attn_prefill"
    }
    fn entry(&self) -> &'static str {
        "attn_prefill"
    }
    fn source_file(&self) -> &'static str {
        "attn_prefill.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Attention
    }
    fn arch_specific_for(&self, d: &Defines) -> Option<Arch> {
        (get_int(d, "ALGO").ok() == Some(2)).then_some(attention::WGMMA_ARCH)
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("ALGO", 1i64),
            ("HEAD_DIM", 256),
            ("SCALAR_WARPS", 4),
            ("BQ", 32),
            ("BKV", 32),
            ("WD", 4),
            ("STAGES", 2),
            ("CP_ASYNC", 1),
            ("WINDOWED", 0),
            ("COUNT_TILES", 0),
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
        let algo = attention::read_prefill(d, a, lim)?;
        crate::family::int_in(d, "WINDOWED", &[0, 1])?;
        crate::family::int_in(d, "COUNT_TILES", &[0, 1])?;
        if a.n_q > 65535 * 16 {
            return Err(format!("{} query tokens in one call", a.n_q));
        }
        Ok(attention::geometry("attn_prefill", &algo, a, 1))
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        attention::workload(gpu, d, p, geo, seed, false)
    }
}

/// The tile count a COUNT_TILES run of `d` on `p` must report (None for the
/// scalar kernel, which has no tiles).
pub fn expected_tiles(d: &Defines, p: &Problem, lim: &DeviceLimits) -> Option<u64> {
    let a = attn_of(p).ok()?;
    match attention::read_prefill(d, a, lim).ok()? {
        Algo::Mma(t) => Some(attention::visited_tiles(
            &t,
            a,
            get_int(d, "WINDOWED").ok()? == 1,
        )),
        Algo::Scalar { .. } => None,
    }
}
