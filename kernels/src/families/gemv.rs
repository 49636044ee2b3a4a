//! `gemv`: decode matmul (1..8 tokens), Q8_0/Q4_0 weights, f32 or Q8_1
//! activations, optional gate+up+GELU fusion; Q6_K weights (the tied LM
//! head of Q4_0 files) as GGUF super-blocks with f32 activations. See
//! kernels/cuda/gemv.cu.

use super::{
    ds_words, gelu_tanh_f64, matmul_f64, matmul_q8_replay, memo, q8_1_replay, seeded_inputs,
    MatmulWorkload, QWeights,
};
use crate::bind::matmul::MatmulBinding;
use crate::bind::{Act, ActFormat};
use crate::defines::{defines, int_in, int_range, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{check_wtype, matmul_of, Problem, WType};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
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
        // Q6_K has one path: f32 activations over the GGUF super-blocks.
        let q6k = (wtype == GgmlType::Q6K) as i64;
        let mut d = defines([
            ("ALGO", 1 - q6k),
            ("LAYOUT", 1 - q6k),
            ("ROWS", 2),
            ("WARPS", 4),
            ("FUSE", 0),
            ("KSPLIT", 1),
            ("UNROLL", 1),
        ]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
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
        let wt = check_wtype(d, mp)?;
        let algo = int_in(d, "ALGO", &[0, 1])?;
        let layout = int_in(d, "LAYOUT", &[0, 1])?;
        let fuse = int_in(d, "FUSE", &[0, 1])?;
        if wt == WType::Q6K {
            // The kernel reads Q6_K super-blocks in one form only.
            if algo != 0 {
                return Err(
                    "Q6_K weights need ALGO=0 (f32 activations): there is no dp4a path over 6-bit quants"
                        .into(),
                );
            }
            if layout != 0 {
                return Err(
                    "Q6_K weights need LAYOUT=0 (GGUF super-blocks): Q6_K has no plane layout"
                        .into(),
                );
            }
            if fuse != 0 {
                return Err(
                    "Q6_K weights need FUSE=0: the fused gate+up form reads Q8_0/Q4_0 FFN matrices"
                        .into(),
                );
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceLimits;
    use crate::quant::{dequantize_row, quantize_row};

    /// The Q6_K chunk decode of gemv.cu replayed on the CPU with the same
    /// byte offsets, aligned word loads and shifts: every weight must equal
    /// the CPU dequantization bit for bit, and no word load may leave its
    /// super-block (past the end) or reach further back than the 2 bytes
    /// the alignment rounds down.
    #[test]
    fn q6k_chunk_decode_replays_the_dequantization() {
        let (n, k) = (3usize, 768usize);
        let mut rng = super::super::rng_for("gemv-q6k-replay", &[n, k], 1);
        let f = super::super::random_matrix(&mut rng, n, k);
        let rb = WType::Q6K.row_bytes(k);
        let mut gguf = vec![0u8; n * rb + 4];
        let mut deq = vec![0f32; n * k];
        for r in 0..n {
            quantize_row(
                GgmlType::Q6K,
                &f[r * k..(r + 1) * k],
                &mut gguf[r * rb..(r + 1) * rb],
            )
            .expect("quantize");
            dequantize_row(
                GgmlType::Q6K,
                &gguf[r * rb..(r + 1) * rb],
                &mut deq[r * k..(r + 1) * k],
            )
            .expect("dequantize");
        }
        let word = |a: usize| u32::from_le_bytes([gguf[a], gguf[a + 1], gguf[a + 2], gguf[a + 3]]);
        let u16_at = |a: usize| u16::from_le_bytes([gguf[a], gguf[a + 1]]);
        // ld32_a2: 9 aligned words, funnel-shifted by the misalignment.
        let ld32 = |p: usize, blk: usize| -> [u32; 8] {
            assert_eq!(p % 2, 0, "runs are 2-byte aligned");
            let (a, sh) = (p & !3, (p & 3) * 8);
            assert!(a + 36 <= blk + 210, "a word load leaves the super-block");
            assert!(a + 2 >= p, "reads at most 2 bytes before the run");
            let v: Vec<u32> = (0..9).map(|i| word(a + 4 * i)).collect();
            let mut w = [0u32; 8];
            for i in 0..8 {
                w[i] = ((((v[i + 1] as u64) << 32) | v[i] as u64) >> sh) as u32;
            }
            w
        };
        let mut seen_misaligned = false;
        for row in 0..n {
            for c in 0..k / 32 {
                let (j, h) = (c % 8, c % 8 / 4);
                let u = j % 4;
                let blk = (row * (k / 256) + c / 8) * 210;
                seen_misaligned |= blk % 4 == 2;
                let lo = ld32(blk + 64 * h + 32 * (u & 1), blk);
                let hi = ld32(blk + 128 + 32 * h, blk);
                let sc = u16_at(blk + 192 + 2 * j) as u32;
                let d = crate::quant::blocks::f16_to_f32(u16_at(blk + 208));
                let (ls, hs) = (4 * (u >> 1), 2 * u);
                let ds = [
                    d * ((sc & 0xff) as u8 as i8) as f32,
                    d * ((sc >> 8) as u8 as i8) as f32,
                ];
                for i in 0..8 {
                    let w = ((lo[i] >> ls) & 0x0F0F_0F0F) | (((hi[i] >> hs) & 0x0303_0303) << 4);
                    for b in 0..4 {
                        // q6f: 2^23 + q as f32 bits, minus 2^23 + 32.
                        let q = (w >> (8 * b)) & 0xff;
                        let qf = f32::from_bits(0x4B00_0000 | q) - 8_388_640.0;
                        assert_eq!(qf, q as f32 - 32.0);
                        let e = 4 * i + b as usize;
                        let got = ds[e / 16] * qf;
                        let want = deq[row * k + c * 32 + e];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "row {row} chunk {c} element {e}: {got} vs {want}"
                        );
                    }
                }
            }
        }
        assert!(
            seen_misaligned,
            "the test must cover super-blocks at 2 mod 4"
        );
    }

    #[test]
    fn q6k_takes_the_fp_path_on_gguf_blocks_only() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let p = Problem::matmul(1, 262144, 2560, GgmlType::Q6K);
        let d = f.default_defines(GgmlType::Q6K);
        let g = f.validate(&d, &p, &lim).expect("Q6_K defaults validate");
        assert_eq!(g.kernel, "gemv_n1");
        assert_eq!(f.contract(&d), Contract::Fp);
        let b = MatmulBinding::of("gemv", &d).expect("bind");
        assert_eq!(b.layout, crate::bind::matmul::WeightLayout::GgufBlocks);
        assert_eq!(b.act, ActFormat::F32);
        assert_eq!(b.weight_bytes(WType::Q6K, 262144, 2560), (262144 * 2100, 0));
        for (name, v, why) in [
            ("ALGO", 1i64, "ALGO=0"),
            ("LAYOUT", 1, "LAYOUT=0"),
            ("FUSE", 1, "FUSE=0"),
        ] {
            let mut bad = d.clone();
            bad.insert(name.into(), DefineValue::Int(v));
            let e = f.validate(&bad, &p, &lim).expect_err(name);
            assert!(e.starts_with("Q6_K weights need") && e.contains(why), "{e}");
        }
        let e = f
            .validate(&d, &Problem::matmul(1, 64, 2592, GgmlType::Q6K), &lim)
            .expect_err("k not whole super-blocks");
        assert!(e.contains("256-element q6_K block"), "{e}");
        let mut lower = d.clone();
        lower.insert("WTYPE".into(), DefineValue::Str("q6_k".into()));
        let e = f.validate(&lower, &p, &lim).expect_err("lower case");
        assert!(e.contains("write it in upper case (Q6_K)"), "{e}");
    }

    #[test]
    fn other_matmul_families_and_references_reject_q6k() {
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let p = Problem::matmul(256, 1024, 2560, GgmlType::Q6K);
        for name in ["mmq", "gemm_dq", "gemm_wgmma"] {
            let f = crate::family::family(name).expect("registered");
            let d = f.default_defines(GgmlType::Q6K);
            let e = f.validate(&d, &p, &lim).expect_err(name);
            assert!(
                e.starts_with(&format!("WTYPE=Q6_K: {name} reads Q8_0 and Q4_0")),
                "{name}: {e}"
            );
        }
        for r in crate::reference::references_for("gemv") {
            let e = r
                .supports(&crate::problem::MatmulProblem {
                    m: 1,
                    n: 1024,
                    k: 2560,
                    wtype: GgmlType::Q6K,
                })
                .expect_err("reference");
            assert!(e.contains("q6_K"), "{e}");
        }
    }
}
