//! `gelu_mul`: `out = gelu_tanh(g) * u` in the next GEMM's activation
//! format. See kernels/cuda/gelu_mul.cu and `bind::rows::GeluMulArgs`.

use super::rows_common::{
    act_replay, check_out_width, format_tolerance, out_format, threads, to_f64, OutRead,
    RowsWorkload,
};
use super::{random_matrix, rng_for};
use crate::bind::rows::GeluMulArgs;
use crate::bind::{Act, ActFormat};
use crate::defines::{defines, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::oracle::gelu_tanh;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

pub struct GeluMul;

/// f64 GELU (tanh form) of an f32.
fn gelu_f64(x: f32) -> f64 {
    let x = x as f64;
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

impl Family for GeluMul {
    fn name(&self) -> &'static str {
        "gelu_mul"
    }
    fn entry(&self) -> &'static str {
        "gelu_mul"
    }
    fn source_file(&self) -> &'static str {
        "gelu_mul.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([("THREADS", 256i64)]);
        d.insert("OUT".into(), "F32".into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match out_format(d) {
            Ok(ActFormat::F32) | Err(_) => Contract::Fp,
            _ => Contract::Approx,
        }
    }
    fn default_tolerance(&self, d: &Defines, _p: &Problem) -> Tolerance {
        // f32 tanh and products: a few ulps per element.
        format_tolerance(out_format(d).unwrap_or(ActFormat::F32), 1e-6)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        _lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let r = rows_of(p)?;
        let f = out_format(d)?;
        let t = threads(d)?;
        check_out_width(f, r.width)?;
        if r.rows == 0 || r.rows > 65535 {
            return Err(format!("{} rows (grid.y holds 1..=65535)", r.rows));
        }
        Ok(LaunchGeometry {
            kernel: "gelu_mul".into(),
            grid: ((r.width / 4).div_ceil(t) as u32, r.rows as u32, 1),
            block: (t as u32, 1, 1),
            dyn_smem: 0,
        })
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let r = rows_of(p).map_err(GpuError::Rejected)?;
        let f = out_format(d).map_err(GpuError::Rejected)?;
        let (rows, w) = (r.rows, r.width);
        let mut rng = rng_for(self.name(), &[rows, w], seed);
        // g and u interleaved per row as one fused gate|up output, so the
        // strides are exercised: row i is [g (w) | u (w)].
        let gu = random_matrix(&mut rng, rows, 2 * w);
        let mut reference = Vec::with_capacity(rows * w);
        let mut vals = Vec::with_capacity(rows * w);
        for i in 0..rows {
            for c in 0..w {
                let (g, u) = (gu[i * 2 * w + c], gu[i * 2 * w + w + c]);
                reference.push(gelu_f64(g) * u as f64);
                vals.push(gelu_tanh(g) * u);
            }
        }
        let replay = to_f64(&act_replay(f, &vals));
        let inp = gpu.upload(&gu)?;
        let out = gpu.alloc(f.bytes(rows, w).max(4))?;
        let out_s = gpu.alloc(f.scale_bytes(rows, w).max(8))?;
        let a = GeluMulArgs {
            g: inp.ptr(),
            g_stride: 2 * w,
            u: inp.ptr() + 4 * w as u64,
            u_stride: 2 * w,
            out: Act {
                format: f,
                data: out.ptr(),
                scales: out_s.ptr(),
            },
            rows,
            width: w,
        };
        let n = (rows * w) as u64;
        Ok(Box::new(RowsWorkload {
            args: a.kargs(),
            bufs: vec![inp, out, out_s],
            outputs: vec![(
                1,
                OutRead::Act {
                    format: f,
                    scales: (f == ActFormat::Q8_1).then_some(2),
                    n: rows * w,
                },
            )],
            restore: Vec::new(),
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (reference.clone(), Some(replay.clone()))),
            bytes: 8 * n + (f.bytes(rows, w) + f.scale_bytes(rows, w)) as u64,
            ops: 10 * n,
        }))
    }
}
