//! `gemm_dq`: prefill GEMM that dequantizes weight tiles to f16/bf16 in
//! registers (straight into MMA fragments) and runs f16/bf16 MMA (m16n8k16,
//! fp32 accumulation).
//! Activations are converted by the `gemm_dq_convert` pre-pass (run once when
//! the workload is built; not timed). See kernels/cuda/gemm_dq.cu.

use super::gemv::fp_rms_bound;
use super::mmq::scales_f32;
use super::tiles::{bkw, geometry, pad16, read_tiles};
use super::{make_weights, matmul_f64, random_matrix, rng_for, Arg, Launch, MatmulWorkload};
use crate::check::Tolerance;
use crate::defines::{defines, get_str, DefineValue, Defines};
use crate::family::{
    check_wtype, matmul_of, Contract, DeviceLimits, Family, LaunchGeometry, Problem,
};
use crate::gpu::{Gpu, GpuError, KArg};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::workload::{OpKind, WeightSet, Workload};

pub struct GemmDq;

fn is_bf16(d: &Defines) -> Result<bool, String> {
    match get_str(d, "DQ_TYPE")?.as_str() {
        "F16" => Ok(false),
        "BF16" => Ok(true),
        o => Err(format!("DQ_TYPE={o}: must be F16 or BF16")),
    }
}

/// Rounds to the MMA operand type and back (the replay's operand rule).
fn round_op(v: f32, bf16: bool) -> f32 {
    if bf16 {
        bf16_to_f32(f32_to_bf16(v))
    } else {
        f16_to_f32(f32_to_f16(v))
    }
}

impl Family for GemmDq {
    fn name(&self) -> &'static str {
        "gemm_dq"
    }
    fn entry(&self) -> &'static str {
        "gemm_dq"
    }
    fn source_file(&self) -> &'static str {
        "gemm_dq.cu"
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
        ]);
        d.insert("WTYPE".into(), crate::family::wtype_define(wtype));
        d.insert("DQ_TYPE".into(), DefineValue::Str("F16".into()));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Approx
    }
    /// Operand rounding (2^-11 for f16, 2^-8 for bf16, on both operands)
    /// gives a k-independent relative RMS error of about u/sqrt(3)*sqrt(2);
    /// the bound allows ~4x that. The replay differs only by fp32 summation.
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        let bf16 = is_bf16(d).unwrap_or(true);
        let u = if bf16 {
            f64::powi(2.0, -8)
        } else {
            f64::powi(2.0, -11)
        };
        Tolerance {
            rms_rel: 4.0 * u,
            max_rel: 20.0 * u,
            outlier_frac: 1e-3,
            replay_rms_rel: 2.0 * fp_rms_bound(matmul_of(p).k),
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p);
        let wt = check_wtype(d, mp)?;
        is_bf16(d)?;
        let t = read_tiles(d, lim, 8)?;
        let stage = t.bm * pad16(2 * t.bk) + t.bn * pad16(bkw(wt, t.bk)) + 4 * t.bn * (t.bk / 32);
        geometry("gemm_dq", &t, mp, t.stages * stage, lim)
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let mp = matmul_of(p);
        let wt = check_wtype(d, mp).map_err(GpuError::Rejected)?;
        let bf16 = is_bf16(d).map_err(GpuError::Rejected)?;
        let (m, n, k) = (mp.m, mp.n, mp.k);
        let mut rng = rng_for(self.name(), &[m, n, k, wt as usize], seed);
        let w = make_weights(&mut rng, wt, n, k)?;
        let x = random_matrix(&mut rng, m, k);
        let planes = vec![
            gpu.upload(&w.qplane)?,
            gpu.upload(&scales_f32(&w.dplane_f16))?,
        ];
        let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
        // The pre-pass converts x on the GPU once (into the k-permuted layout
        // only gemm_dq reads); its output is what the GEMM reads, so the
        // check covers it too.
        let x_dev = gpu.upload(&x)?;
        let xh = gpu.alloc(m * k * 2)?;
        let module = gpu.load(&crate::compile::compile(
            self,
            d,
            gpu.arch(),
            crate::compile::default_cache_dir().as_deref(),
        )?)?;
        let pairs = (m * k / 2) as u64;
        let cgeo = LaunchGeometry {
            kernel: "gemm_dq_convert".into(),
            grid: (pairs.div_ceil(256) as u32, 1, 1),
            block: (256, 1, 1),
            dyn_smem: 0,
        };
        gpu.launch(&module, &cgeo, &[x_dev.arg(), xh.arg(), KArg::U64(pairs)])?;
        gpu.synchronize()?;
        let y = gpu.alloc(m * n * 4)?;
        let deq = w.deq;
        let reference: super::RefFn = Box::new(move || {
            let wr: Vec<f32> = deq.iter().map(|&v| round_op(v, bf16)).collect();
            let xr: Vec<f32> = x.iter().map(|&v| round_op(v, bf16)).collect();
            (
                matmul_f64(&deq, &x, m, n, k),
                Some(matmul_f64(&wr, &xr, m, n, k)),
            )
        });
        let main = Launch {
            geo: geo.clone(),
            args: vec![
                Arg::W(0),
                Arg::W(1),
                Arg::A(0),
                Arg::Y,
                Arg::I32(m as i32),
                Arg::I32(n as i32),
                Arg::I32(k as i32),
            ],
        };
        Ok(Box::new(MatmulWorkload {
            weights: WeightSet::new(planes),
            acts: vec![xh],
            y,
            main,
            reference,
            bytes: weight_bytes + (m * k * 2 + m * n * 4) as u64,
            ops: 2 * (m * n * k) as u64,
            op_kind: OpKind::Flop,
        }))
    }
}
