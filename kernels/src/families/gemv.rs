//! `gemv`: decode matmul (1..8 tokens), Q8_0/Q4_0 weights, f32 or Q8_1
//! activations, optional gate+up+GELU fusion. See kernels/cuda/gemv.cu.

use super::{
    ds_words, gelu_tanh_f64, matmul_f64, matmul_q8_replay, memo, q8_1_replay, seeded_inputs,
    MatmulWorkload, QWeights,
};
use crate::bind::matmul::MatmulBinding;
use crate::bind::{Act, ActFormat};
use crate::check::Tolerance;
use crate::defines::{defines, DefineValue, Defines};
use crate::family::{
    check_wtype, int_in, int_range, matmul_of, Contract, DeviceLimits, Family, LaunchGeometry,
    Problem,
};
use crate::gpu::{Gpu, GpuError};
use crate::quant::GgmlType;
use crate::workload::{OpKind, WeightSet, Workload};

pub struct Gemv;

/// Tolerance of an f32-accumulated dot product of length k: a few times the
/// random-walk growth of f32 rounding (sqrt(k) * 2^-24), plus a floor.
pub(crate) fn fp_rms_bound(k: usize) -> f64 {
    4.0 * (k as f64).sqrt() * f64::powi(2.0, -24) + 1e-6
}

impl Family for Gemv {
    fn name(&self) -> &'static str {
        "gemv"
    }
    fn entry(&self) -> &'static str {
        "gemv_n"
    }
    fn source_file(&self) -> &'static str {
        "gemv.cu"
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("ALGO", 1i64),
            ("LAYOUT", 1),
            ("ROWS", 2),
            ("WARPS", 4),
            ("FUSE", 0),
            ("KSPLIT", 1),
            ("UNROLL", 1),
        ]);
        d.insert("WTYPE".into(), crate::family::wtype_define(wtype));
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match d.get("ALGO") {
            Some(DefineValue::Int(1)) => Contract::Approx,
            _ => Contract::Fp,
        }
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        let k = matmul_of(p).map(|m| m.k).unwrap_or(32);
        let fp = fp_rms_bound(k);
        let fused = matches!(d.get("FUSE"), Some(DefineValue::Int(1)));
        match self.contract(d) {
            // Q8_1 rounding of uniform activations: ~0.4% RMS, independent of
            // k; gelu(g)*u combines two such errors and gelu's slope near 0
            // amplifies them, so the fused bound is looser.
            Contract::Approx if fused => Tolerance {
                rms_rel: 3e-2,
                max_rel: 0.15,
                outlier_frac: 1e-3,
                replay_rms_rel: fp,
            },
            Contract::Approx => Tolerance {
                rms_rel: 1e-2,
                max_rel: 5e-2,
                outlier_frac: 1e-3,
                replay_rms_rel: fp,
            },
            _ => Tolerance {
                rms_rel: fp,
                max_rel: 20.0 * fp,
                outlier_frac: 0.0,
                replay_rms_rel: fp,
            },
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p)?;
        check_wtype(d, mp)?;
        int_in(d, "ALGO", &[0, 1])?;
        int_in(d, "LAYOUT", &[0, 1])?;
        int_in(d, "FUSE", &[0, 1])?;
        let rows = int_range(d, "ROWS", 1, 8)?;
        let warps = int_range(d, "WARPS", 1, 32)?;
        let ksplit = int_in(d, "KSPLIT", &[1, 2, 4, 8])?;
        int_in(d, "UNROLL", &[1, 2, 4])?;
        if warps % ksplit != 0 {
            return Err(format!("KSPLIT={ksplit} does not divide WARPS={warps}"));
        }
        if !(1..=8).contains(&mp.m) {
            return Err(format!("gemv handles 1..8 tokens, not m={}", mp.m));
        }
        let threads = warps * 32;
        if threads > lim.max_threads_per_block as i64 {
            return Err(format!(
                "{threads} threads exceed the device's {}",
                lim.max_threads_per_block
            ));
        }
        let per_block = (warps / ksplit * rows) as usize;
        Ok(LaunchGeometry {
            kernel: format!("gemv_n{}", mp.m),
            grid: (mp.n.div_ceil(per_block) as u32, 1, 1),
            block: (threads as u32, 1, 1),
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
        let mp = matmul_of(p).map_err(GpuError::Rejected)?;
        let wt = check_wtype(d, mp).map_err(GpuError::Rejected)?;
        let algo = crate::defines::get_int(d, "ALGO").map_err(GpuError::Rejected)?;
        let layout = crate::defines::get_int(d, "LAYOUT").map_err(GpuError::Rejected)?;
        let fuse = crate::defines::get_int(d, "FUSE").map_err(GpuError::Rejected)? == 1;
        let (m, n, k) = (mp.m, mp.n, mp.k);
        let inputs = seeded_inputs(
            self.name(),
            &[m, n, k, wt as usize, fuse as usize],
            wt,
            m,
            n,
            k,
            1 + fuse as usize,
            seed,
        )?;
        let x = &inputs.x;
        let mats: Vec<&QWeights> = inputs.w.iter().collect();
        let mut planes = Vec::new();
        for w in &mats {
            if layout == 0 {
                planes.push(gpu.upload(&w.gguf)?);
            } else {
                planes.push(gpu.upload(&w.qplane)?);
                planes.push(gpu.upload(&w.dplane_f16)?);
            }
        }
        let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
        let (q, ds) = q8_1_replay(x);
        let (acts, act_bytes) = if algo == 0 {
            (vec![gpu.upload(x)?], (m * k * 4) as u64)
        } else {
            let bytes = (q.len() + ds.len() * 8) as u64;
            (vec![gpu.upload(&q)?, gpu.upload(&ds_words(&ds))?], bytes)
        };
        let key = format!("gemv {m} {n} {k} {wt:?} fuse={fuse} {seed}");
        let inp = inputs.clone();
        let reference: super::RefFn = Box::new(move || {
            let combine = |parts: &[Vec<f64>]| -> Vec<f64> {
                if fuse {
                    parts[0]
                        .iter()
                        .zip(&parts[1])
                        .map(|(g, u)| gelu_tanh_f64(*g) * u)
                        .collect()
                } else {
                    parts[0].clone()
                }
            };
            let r = memo::get(format!("{key} ref"), || {
                let refs: Vec<Vec<f64>> = inp
                    .w
                    .iter()
                    .map(|w| matmul_f64(&w.deq, &inp.x, m, n, k))
                    .collect();
                combine(&refs)
            });
            let replay = (algo == 1).then(|| {
                let rp = memo::get(format!("{key} replay q8_1"), || {
                    let rp: Vec<Vec<f64>> = inp
                        .w
                        .iter()
                        .map(|w| matmul_q8_replay(&w.deq, &q, &ds, m, n, k))
                        .collect();
                    combine(&rp)
                });
                (*rp).clone()
            });
            ((*r).clone(), replay)
        });
        let y = gpu.alloc(m * n * 4)?;
        let binding = MatmulBinding::of(self.name(), d).map_err(GpuError::Rejected)?;
        let act = match binding.act {
            ActFormat::F32 => Act::f32(acts[0].ptr()),
            format => Act {
                format,
                data: acts[0].ptr(),
                scales: acts[1].ptr(),
            },
        };
        let nmat = mats.len() as u64;
        Ok(Box::new(MatmulWorkload {
            weights: WeightSet::new(planes),
            _acts: acts,
            act,
            y,
            geo: geo.clone(),
            binding,
            m,
            n,
            k,
            reference,
            bytes: weight_bytes + act_bytes + (m * n * 4) as u64,
            ops: 2 * (m * n * k) as u64 * nmat,
            op_kind: if algo == 0 {
                OpKind::Flop
            } else {
                OpKind::IntOp
            },
        }))
    }
}
