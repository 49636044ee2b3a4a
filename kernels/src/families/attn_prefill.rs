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
            ("PERSIST", 0),
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
        if crate::family::int_in(d, "PERSIST", &[0, 1])? == 1
            && !matches!(algo, Algo::Mma(t) if t.wgmma)
        {
            return Err("PERSIST=1 is the wgmma loop's schedule (ALGO=2)".into());
        }
        if a.n_q > 65535 * 16 {
            return Err(format!("{} query tokens in one call", a.n_q));
        }
        Ok(attention::geometry("attn_prefill", &algo, a, 1, lim))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::family::{AttnProblem, KvType};

    #[test]
    fn the_persistent_schedule_is_the_wgmma_loops_only() {
        let f = AttnPrefill;
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = Problem::Attention(AttnProblem {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 256,
            window: 512,
            q_pos0: 0,
            n_q: 4096,
            capacity: 4096,
            kv_type: KvType::F16,
        });
        let mut d = f.default_defines(GgmlType::F16);
        d.insert("PERSIST".into(), 1i64.into());
        let e = f.validate(&d, &p, &lim).unwrap_err();
        assert!(e.contains("ALGO=2"), "{e}");
        for (k, v) in [("ALGO", 2i64), ("BQ", 128), ("BKV", 32), ("WD", 1)] {
            d.insert(k.into(), v.into());
        }
        let g = f
            .validate(&d, &p, &lim)
            .expect("the persistent window tile");
        assert_eq!(g.grid, (132, 1, 1));
        d.insert("PERSIST".into(), 2i64.into());
        assert!(f.validate(&d, &p, &lim).is_err());
    }
}
