//! `rmsnorm`: the sandwich-norm step (residual add of a normalized output,
//! layer scalar, next norm in the next GEMM's format). See
//! kernels/cuda/rmsnorm.cu and `bind::rows::RmsNormArgs`.

use super::rows_common::{
    act_replay, check_out_width, format_tolerance, out_format, threads, to_f64, OutRead,
    RowsWorkload,
};
use super::{gemv::fp_rms_bound, random_matrix, rng_for};
use crate::bind::rows::RmsNormArgs;
use crate::bind::{Act, ActFormat, NULL};
use crate::defines::{defines, int_in, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;
use rand::Rng;

pub struct RmsNorm;

/// Float4 registers per thread (MAXV in the kernel).
const MAXV: usize = 8;
const EPS: f32 = 1e-6;

fn modes(d: &Defines) -> Result<(bool, bool), String> {
    let add = int_in(d, "ADD", &[0, 1])? == 1;
    let norm_out = int_in(d, "NORM_OUT", &[0, 1])? == 1;
    if !add && !norm_out {
        return Err("ADD=0 with NORM_OUT=0 computes nothing".into());
    }
    Ok((add, norm_out))
}

/// f64 rmsnorm scale of a row.
fn inv_rms(v: &[f32], eps: f32) -> f64 {
    let ss: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
    1.0 / (ss / v.len() as f64 + eps as f64).sqrt()
}

impl Family for RmsNorm {
    fn name(&self) -> &'static str {
        "rmsnorm"
    }
    fn entry(&self) -> &'static str {
        "rmsnorm"
    }
    fn source_file(&self) -> &'static str {
        "rmsnorm.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([("ADD", 0i64), ("NORM_OUT", 1), ("THREADS", 256)]);
        d.insert("OUT".into(), "F32".into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match out_format(d) {
            Ok(ActFormat::F32) | Err(_) => Contract::Fp,
            _ => Contract::Approx,
        }
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        let w = rows_of(p).map(|r| r.width).unwrap_or(1024);
        format_tolerance(
            out_format(d).unwrap_or(ActFormat::F32),
            4.0 * fp_rms_bound(w),
        )
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let r = rows_of(p)?;
        modes(d)?;
        let f = out_format(d)?;
        let t = threads(d)?.min(lim.max_threads_per_block as usize);
        check_out_width(f, r.width)?;
        if r.width > 4 * MAXV * t {
            return Err(format!(
                "width {} exceeds the {} values THREADS={t} threads hold in registers",
                r.width,
                4 * MAXV * t
            ));
        }
        if r.rows == 0 || r.rows > i32::MAX as usize {
            return Err(format!("{} rows", r.rows));
        }
        Ok(LaunchGeometry {
            kernel: "rmsnorm".into(),
            grid: (r.rows as u32, 1, 1),
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
        let (add, norm_out) = modes(d).map_err(GpuError::Rejected)?;
        let f = out_format(d).map_err(GpuError::Rejected)?;
        let (rows, w) = (r.rows, r.width);
        let mut rng = rng_for(
            self.name(),
            &[rows, w, add as usize, norm_out as usize],
            seed,
        );
        let h = random_matrix(&mut rng, rows, w);
        let y = random_matrix(&mut rng, rows, w);
        let w_add: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let w_out: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let scale = [rng.random_range(0.1f32..0.9)];
        // Every other seed checks the weightless norm.
        let weighted = seed % 2 == 0 || !norm_out;

        // The f64 reference and the f32 replay of the format conversion.
        let mut h_ref = vec![0f64; rows * w];
        let mut o_ref = vec![0f64; rows * w];
        let mut o_f32 = vec![0f32; rows * w];
        for i in 0..rows {
            let hr = &h[i * w..(i + 1) * w];
            let mut hn: Vec<f64> = hr.iter().map(|&x| x as f64).collect();
            if add {
                let yr = &y[i * w..(i + 1) * w];
                let s = inv_rms(yr, EPS);
                for c in 0..w {
                    hn[c] = (hn[c] + yr[c] as f64 * s * w_add[c] as f64) * scale[0] as f64;
                }
            }
            h_ref[i * w..(i + 1) * w].copy_from_slice(&hn);
            let hf: Vec<f32> = hn.iter().map(|&x| x as f32).collect();
            let s = inv_rms(&hf, EPS);
            for c in 0..w {
                let g = if weighted { w_out[c] as f64 } else { 1.0 };
                o_ref[i * w + c] = hn[c] * s * g;
                o_f32[i * w + c] = (hn[c] * s * g) as f32;
            }
        }
        let mut reference = Vec::new();
        let mut replay = Vec::new();
        if add {
            reference.extend_from_slice(&h_ref);
            replay.extend_from_slice(&h_ref);
        }
        if norm_out {
            reference.extend_from_slice(&o_ref);
            replay.extend(to_f64(&act_replay(f, &o_f32)));
        }

        let h_buf = gpu.upload(&h)?;
        let y_buf = gpu.upload(&y)?;
        let wa = gpu.upload(&w_add)?;
        let wo = gpu.upload(&w_out)?;
        let sc = gpu.upload(&scale)?;
        let out = gpu.alloc(f.bytes(rows, w).max(4))?;
        let out_s = gpu.alloc(f.scale_bytes(rows, w).max(8))?;
        let a = RmsNormArgs {
            h: h_buf.ptr(),
            y: if add { y_buf.ptr() } else { NULL },
            w_add: if add { wa.ptr() } else { NULL },
            scale: if add { sc.ptr() } else { NULL },
            w_out: if weighted { wo.ptr() } else { NULL },
            out: Act {
                format: f,
                data: out.ptr(),
                scales: out_s.ptr(),
            },
            rows,
            width: w,
            eps: EPS,
        };
        let args = a.kargs();
        let mut outputs = Vec::new();
        if add {
            outputs.push((0, OutRead::F32));
        }
        if norm_out {
            outputs.push((
                5,
                OutRead::Act {
                    format: f,
                    scales: (f == ActFormat::Q8_1).then_some(6),
                    n: rows * w,
                },
            ));
        }
        let n = (rows * w) as u64;
        let bytes = 4 * n * (1 + add as u64 * 2)
            + if norm_out {
                (f.bytes(rows, w) + f.scale_bytes(rows, w)) as u64
            } else {
                0
            };
        Ok(Box::new(RowsWorkload {
            bufs: vec![h_buf, y_buf, wa, wo, sc, out, out_s],
            outputs,
            restore: if add {
                vec![(0, gpu.upload(&h)?)]
            } else {
                Vec::new()
            },
            args,
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (reference.clone(), Some(replay.clone()))),
            bytes,
            ops: 6 * n,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::problem::RowsProblem;

    fn p(rows: usize, width: usize) -> Problem {
        Problem::Rows(RowsProblem {
            rows,
            width,
            dtype: GgmlType::F32,
            aux: 0,
        })
    }

    #[test]
    fn validate_checks_modes_formats_and_widths() {
        let f = RmsNorm;
        let lim = DeviceLimits::for_arch(Arch(90));
        let mut d = f.default_defines(GgmlType::F32);
        let g = f.validate(&d, &p(7, 2560), &lim).expect("valid");
        assert_eq!(g.grid, (7, 1, 1));
        d.insert("OUT".into(), "Q8_1".into());
        assert!(f.validate(&d, &p(1, 2560), &lim).is_ok());
        assert!(
            f.validate(&d, &p(1, 2568), &lim).is_err(),
            "Q8_1 needs width % 32"
        );
        d.insert("NORM_OUT".into(), 0i64.into());
        assert!(f.validate(&d, &p(1, 64), &lim).is_err(), "nothing to do");
        let d = f.default_defines(GgmlType::F32);
        assert!(
            f.validate(&d, &p(1, 4 * 8 * 256 + 4), &lim).is_err(),
            "too wide"
        );
        assert!(f
            .validate(&d, &Problem::matmul(1, 8, 32, GgmlType::Q8_0), &lim)
            .is_err());
    }
}
