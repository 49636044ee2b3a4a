//! `mmq`: prefill GEMM on int8 tensor cores (m16n8k32), Q8_0/Q4_0 weights x
//! Q8_1 activations, per-32 scales in the epilogue. See kernels/cuda/mmq.cu.

use super::gemv::fp_rms_bound;
use super::tiles::{bkw, geometry, pad16, read_tiles};
use super::{
    ds_words, matmul_f64, matmul_q8_replay, memo, q8_1_replay, seeded_inputs, MatmulWorkload,
};
use crate::bind::matmul::MatmulBinding;
use crate::bind::{Act, ActFormat};
use crate::defines::{defines, int_in, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{check_block32_wtype, matmul_of, Problem};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::{OpKind, WeightSet, Workload};

pub struct Mmq;

/// f32 copy of an f16 scale plane (exact).
pub(crate) fn scales_f32(d: &[u16]) -> Vec<f32> {
    d.iter().map(|&h| super::f16_to_f32(h)).collect()
}

impl Family for Mmq {
    fn name(&self) -> &'static str {
        "mmq"
    }
    fn entry(&self) -> &'static str {
        "mmq"
    }
    fn source_file(&self) -> &'static str {
        "mmq.cu"
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("BM", 128i64),
            ("BN", 128),
            ("BK", 64),
            ("WARPS_M", 2),
            ("WARPS_N", 4),
            ("STAGES", 3),
            ("CP_ASYNC", 1),
            ("EPI", 1),
        ]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Approx
    }
    fn default_tolerance(&self, _d: &Defines, p: &Problem) -> Tolerance {
        Tolerance {
            rms_rel: 1e-2,
            max_rel: 5e-2,
            outlier_frac: 1e-3,
            replay_rms_rel: fp_rms_bound(matmul_of(p).map(|m| m.k).unwrap_or(32)),
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p)?;
        let wt = check_block32_wtype(self.name(), d, mp)?;
        int_in(d, "EPI", &[0, 1])?;
        let t = read_tiles(d, lim, 8)?;
        let kb = t.bk / 32;
        let stage = t.bm * pad16(t.bk) + t.bn * pad16(bkw(wt, t.bk)) + 4 * (t.bm + t.bn) * kb;
        geometry("mmq", &t, mp, t.stages * stage, lim)
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let mp = matmul_of(p).map_err(GpuError::Rejected)?;
        let wt = check_block32_wtype(self.name(), d, mp).map_err(GpuError::Rejected)?;
        let (m, n, k) = (mp.m, mp.n, mp.k);
        let inputs = seeded_inputs(self.name(), &[m, n, k, wt as usize], wt, m, n, k, 1, seed)?;
        let w = &inputs.w[0];
        let (q, ds) = q8_1_replay(&inputs.x);
        let planes = vec![
            gpu.upload(&w.qplane)?,
            gpu.upload(&scales_f32(&w.dplane_f16))?,
        ];
        let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
        let acts = vec![gpu.upload(&q)?, gpu.upload(&ds_words(&ds))?];
        let key = format!("mmq {m} {n} {k} {wt:?} {seed}");
        let reference: super::RefFn = Box::new(move || {
            let (deq, x) = (&inputs.w[0].deq, &inputs.x);
            let r = memo::get(format!("{key} ref"), || matmul_f64(deq, x, m, n, k));
            let rp = memo::get(format!("{key} replay q8_1"), || {
                matmul_q8_replay(deq, &q, &ds, m, n, k)
            });
            ((*r).clone(), Some((*rp).clone()))
        });
        let y = gpu.alloc(m * n * 4)?;
        let binding = MatmulBinding::of(self.name(), d).map_err(GpuError::Rejected)?;
        let act = Act {
            format: ActFormat::Q8_1,
            data: acts[0].ptr(),
            scales: acts[1].ptr(),
        };
        Ok(Box::new(MatmulWorkload {
            weights: WeightSet::new(planes),
            _acts: acts,
            act,
            y,
            side: None,
            tail: None,
            geo: geo.clone(),
            binding,
            m,
            n,
            k,
            reference,
            bytes: weight_bytes + (m * k + m * k / 32 * 8 + m * n * 4) as u64,
            ops: 2 * (m * n * k) as u64,
            op_kind: OpKind::IntOp,
        }))
    }
}
