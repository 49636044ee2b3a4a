//! `rmsnorm`: the sandwich-norm step (residual add of a normalized output,
//! layer scalar, next norm in the next GEMM's format). See
//! kernels/cuda/rmsnorm.cu and `bind::rows::RmsNormArgs`.

use super::rows_common::{
    act_replay, check_out_width, format_tolerance, out_format, threads, to_f64, OutRead,
    RowsWorkload,
};
use super::{gemv::fp_rms_bound, random_matrix, rng_for};
use crate::bind::rows::{RmsNormArgs, RmsNormMoe};
use crate::bind::{Act, ActFormat, DevPtr, NULL};
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

/// The call-site modes of a launch.
#[derive(Clone, Copy, Debug)]
struct Modes {
    add: bool,
    norm_out: bool,
    /// SUM_IN: the addend is the sum of two normalized rows.
    sum_in: bool,
    /// OUTS=3: two more f32 normalized outputs.
    outs3: bool,
}

fn modes(d: &Defines) -> Result<Modes, String> {
    let add = int_in(d, "ADD", &[0, 1])? == 1;
    let norm_out = int_in(d, "NORM_OUT", &[0, 1])? == 1;
    let sum_in = int_in(d, "SUM_IN", &[0, 1])? == 1;
    let outs3 = int_in(d, "OUTS", &[1, 3])? == 3;
    if !add && !norm_out {
        return Err("ADD=0 with NORM_OUT=0 computes nothing".into());
    }
    if sum_in && !add {
        return Err("SUM_IN=1 sums the addend of ADD=1; ADD=0 has none".into());
    }
    if outs3 && !norm_out {
        return Err("OUTS=3 writes more normalized outputs; NORM_OUT=0 writes none".into());
    }
    Ok(Modes {
        add,
        norm_out,
        sum_in,
        outs3,
    })
}

/// f64 rmsnorm scale of a row.
fn inv_rms(v: &[f32], eps: f32) -> f64 {
    let ss: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
    1.0 / (ss / v.len() as f64 + eps as f64).sqrt()
}

/// f64 rmsnorm scale of an f64 row.
fn inv_rms_f64(v: &[f64], eps: f32) -> f64 {
    let ss: f64 = v.iter().map(|&x| x * x).sum();
    1.0 / (ss / v.len() as f64 + eps as f64).sqrt()
}

/// The residual add of the sandwich step on one row, in f64:
/// `h = (h + rmsnorm(addend) * w_add) * scale` (rmsnorm.cu with ADD=1,
/// gemv's TAIL).
pub(crate) fn residual_add_f64(h: &mut [f64], addend: &[f64], w_add: &[f32], scale: f64, eps: f32) {
    let s = inv_rms_f64(addend, eps);
    for ((hc, &a), &w) in h.iter_mut().zip(addend).zip(w_add) {
        *hc = (*hc + a * s * w as f64) * scale;
    }
}

/// The normalized output of the step on one row: `rmsnorm(h) * w_out`
/// (`None`: weightless), its scale taken over the f32 rounding of `h`, the
/// values the kernel stored and reads back.
pub(crate) fn norm_out_f64(h: &[f64], w_out: Option<&[f32]>, eps: f32) -> Vec<f64> {
    let hf: Vec<f32> = h.iter().map(|&x| x as f32).collect();
    let s = inv_rms(&hf, eps);
    h.iter()
        .enumerate()
        .map(|(c, &v)| v * s * w_out.map_or(1.0, |w| w[c] as f64))
        .collect()
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
        let mut d = defines([
            ("ADD", 0i64),
            ("NORM_OUT", 1),
            ("SUM_IN", 0),
            ("OUTS", 1),
            ("THREADS", 256),
        ]);
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
        let m = modes(d).map_err(GpuError::Rejected)?;
        let (add, norm_out) = (m.add, m.norm_out);
        let f = out_format(d).map_err(GpuError::Rejected)?;
        let (rows, w) = (r.rows, r.width);
        let mut rng = rng_for(
            self.name(),
            &[
                rows,
                w,
                add as usize,
                norm_out as usize,
                m.sum_in as usize,
                m.outs3 as usize,
            ],
            seed,
        );
        let h = random_matrix(&mut rng, rows, w);
        let y = random_matrix(&mut rng, rows, w);
        let w_add: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let w_out: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let scale = [rng.random_range(0.1f32..0.9)];
        // SUM_IN's second row and the two weights of the sum; OUTS=3's two
        // output weights. The second row is drawn at another scale, so a
        // kernel that skipped either norm of the sum would be caught.
        let y2: Vec<f32> = random_matrix(&mut rng, rows, w)
            .into_iter()
            .map(|v| 7.0 * v)
            .collect();
        let w_y: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let w_y2: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let w_out2: Vec<f32> = (0..w).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let w_out3: Vec<f32> = (0..w).map(|_| rng.random_range(-1.5f32..1.5)).collect();
        // Every other seed checks the weightless norm.
        let weighted = seed % 2 == 0 || !norm_out;

        // The f64 reference and the f32 replay of the format conversion.
        let mut h_ref = vec![0f64; rows * w];
        let mut o_ref = vec![0f64; rows * w];
        let mut o_f32 = vec![0f32; rows * w];
        let mut o2_ref = vec![0f64; rows * w];
        let mut o3_ref = vec![0f64; rows * w];
        for i in 0..rows {
            let hr = &h[i * w..(i + 1) * w];
            let mut hn: Vec<f64> = hr.iter().map(|&x| x as f64).collect();
            if add {
                let yr = &y[i * w..(i + 1) * w];
                // The addend: y, or the sum of the two normalized rows.
                let addend: Vec<f64> = if m.sum_in {
                    let y2r = &y2[i * w..(i + 1) * w];
                    let (s1, s2) = (inv_rms(yr, EPS), inv_rms(y2r, EPS));
                    (0..w)
                        .map(|c| {
                            yr[c] as f64 * s1 * w_y[c] as f64 + y2r[c] as f64 * s2 * w_y2[c] as f64
                        })
                        .collect()
                } else {
                    yr.iter().map(|&x| x as f64).collect()
                };
                residual_add_f64(&mut hn, &addend, &w_add, scale[0] as f64, EPS);
            }
            h_ref[i * w..(i + 1) * w].copy_from_slice(&hn);
            let o = norm_out_f64(&hn, weighted.then_some(&w_out[..]), EPS);
            let o2 = norm_out_f64(&hn, Some(&w_out2), EPS);
            let o3 = norm_out_f64(&hn, Some(&w_out3), EPS);
            for c in 0..w {
                o_ref[i * w + c] = o[c];
                o_f32[i * w + c] = o[c] as f32;
                o2_ref[i * w + c] = o2[c];
                o3_ref[i * w + c] = o3[c];
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
        if m.outs3 {
            for o in [&o2_ref, &o3_ref] {
                reference.extend_from_slice(o);
                replay.extend_from_slice(o);
            }
        }

        let h_buf = gpu.upload(&h)?;
        let y_buf = gpu.upload(&y)?;
        let wa = gpu.upload(&w_add)?;
        let wo = gpu.upload(&w_out)?;
        let sc = gpu.upload(&scale)?;
        let out = gpu.alloc(f.bytes(rows, w).max(4))?;
        let out_s = gpu.alloc(f.scale_bytes(rows, w).max(8))?;
        let y2_buf = gpu.upload(&y2)?;
        let wy = gpu.upload(&w_y)?;
        let wy2 = gpu.upload(&w_y2)?;
        let out2 = gpu.alloc(4 * rows * w)?;
        let wo2 = gpu.upload(&w_out2)?;
        let out3 = gpu.alloc(4 * rows * w)?;
        let wo3 = gpu.upload(&w_out3)?;
        let on = |b: bool, p: DevPtr| if b { p } else { NULL };
        let a = RmsNormArgs {
            h: h_buf.ptr(),
            y: on(add, y_buf.ptr()),
            w_add: on(add, wa.ptr()),
            scale: on(add, sc.ptr()),
            w_out: on(weighted, wo.ptr()),
            out: Act {
                format: f,
                data: out.ptr(),
                scales: out_s.ptr(),
            },
            moe: RmsNormMoe {
                y2: on(m.sum_in, y2_buf.ptr()),
                w_y: on(m.sum_in, wy.ptr()),
                w_y2: on(m.sum_in, wy2.ptr()),
                out2: on(m.outs3, out2.ptr()),
                w_out2: on(m.outs3, wo2.ptr()),
                out3: on(m.outs3, out3.ptr()),
                w_out3: on(m.outs3, wo3.ptr()),
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
        if m.outs3 {
            // Buffer indices of out2 and out3 in `bufs` below.
            outputs.push((10, OutRead::F32));
            outputs.push((12, OutRead::F32));
        }
        let n = (rows * w) as u64;
        let bytes = 4 * n * (1 + add as u64 * 2 + m.sum_in as u64 + 2 * m.outs3 as u64)
            + if norm_out {
                (f.bytes(rows, w) + f.scale_bytes(rows, w)) as u64
            } else {
                0
            };
        Ok(Box::new(RowsWorkload {
            bufs: vec![
                h_buf, y_buf, wa, wo, sc, out, out_s, y2_buf, wy, wy2, out2, wo2, out3, wo3,
            ],
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
            ops: 6 * n * (1 + m.sum_in as u64 + m.outs3 as u64),
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
