//! `softcap`: the final logit softcap in place. See kernels/cuda/softcap.cu
//! and `bind::rows::SoftcapArgs`.

use super::rows_common::{threads, OutRead, RowsWorkload};
use super::{random_matrix, rng_for};
use crate::bind::rows::SoftcapArgs;
use crate::defines::{defines, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

pub struct Softcap;

/// Gemma 4's final logit cap.
const CAP: f32 = 30.0;

impl Family for Softcap {
    fn name(&self) -> &'static str {
        "softcap"
    }
    fn entry(&self) -> &'static str {
        "softcap"
    }
    fn source_file(&self) -> &'static str {
        "softcap.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        defines([("THREADS", 256i64)])
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Fp
    }
    fn default_tolerance(&self, _d: &Defines, _p: &Problem) -> Tolerance {
        Tolerance {
            rms_rel: 1e-6,
            max_rel: 1e-5,
            outlier_frac: 0.0,
            replay_rms_rel: 1e-6,
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        _lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let r = rows_of(p)?;
        let t = threads(d)?;
        if r.width == 0 || r.width % 4 != 0 {
            return Err(format!("width {} is not a positive multiple of 4", r.width));
        }
        if r.rows == 0 || r.rows > 65535 {
            return Err(format!("{} rows (grid.y holds 1..=65535)", r.rows));
        }
        Ok(LaunchGeometry {
            kernel: "softcap".into(),
            grid: ((r.width / 4).div_ceil(t) as u32, r.rows as u32, 1),
            block: (t as u32, 1, 1),
            dyn_smem: 0,
        })
    }
    fn workload(
        &self,
        gpu: &Gpu,
        _d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let r = rows_of(p).map_err(GpuError::Rejected)?;
        let mut rng = rng_for(self.name(), &[r.rows, r.width], seed);
        // Logit-sized values, some past the cap.
        let x: Vec<f32> = random_matrix(&mut rng, r.rows, r.width)
            .into_iter()
            .map(|v| v * 40.0)
            .collect();
        let reference: Vec<f64> = x
            .iter()
            .map(|&v| CAP as f64 * (v as f64 / CAP as f64).tanh())
            .collect();
        let buf = gpu.upload(&x)?;
        let a = SoftcapArgs {
            x: buf.ptr(),
            rows: r.rows,
            width: r.width,
            cap: CAP,
        };
        let n = (r.rows * r.width) as u64;
        Ok(Box::new(RowsWorkload {
            args: a.kargs(),
            restore: vec![(0, gpu.upload(&x)?)],
            bufs: vec![buf],
            outputs: vec![(0, OutRead::F32)],
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (reference.clone(), None)),
            bytes: 8 * n,
            ops: 4 * n,
        }))
    }
}
