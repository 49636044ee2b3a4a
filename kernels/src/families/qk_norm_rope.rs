//! `qk_norm_rope`: per-head Q/K norms, NeoX RoPE and the K/V cache write of
//! one attention call. See kernels/cuda/qk_norm_rope.cu and
//! `bind::rows::QkNormRopeArgs`.
//!
//! The check feeds one fused Q|K|V projection output (so the strides are
//! exercised), fills both caches with random values first (a write to the
//! wrong slot, or a missing one, shows in the whole-cache comparison), and
//! uses the RoPE of the head width: default over 256 dims (theta 1e4) or
//! the proportional form over 512 (64 rotated pairs at theta 1e6, the rest
//! passed through).

use super::rows_common::{OutRead, RowsWorkload};
use super::{random_matrix, rng_for};
use crate::bind::rows::QkNormRopeArgs;
use crate::defines::{get_str, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{attn_of, AttnProblem, KvType, Problem, ProblemKind};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;
use rand::Rng;

pub struct QkNormRope;

const EPS: f32 = 1e-6;

/// The inverse frequencies of a head width as Gemma 4 uses them: the
/// sliding layers' default RoPE (base 1e4) below 512, the full layers'
/// proportional RoPE (base 1e6, 64 rotated pairs) at 512.
pub fn gemma4_inv_freq(hd: usize) -> Vec<f64> {
    if hd >= 512 {
        let ff = crate::oracle::proportional_freq_factors(hd, 64);
        crate::oracle::rope_inv_freq(1e6, hd, Some(&ff))
    } else {
        crate::oracle::rope_inv_freq(1e4, hd, None)
    }
}

fn kv_type(d: &Defines, p: &AttnProblem) -> Result<KvType, String> {
    let s = get_str(d, "KV_TYPE")?;
    let t = KvType::from_name(&s).ok_or_else(|| format!("KV_TYPE={s} is not F16, BF16 or F32"))?;
    if t != p.kv_type {
        return Err(format!(
            "KV_TYPE={s} does not match the shape's cache type {}",
            p.kv_type.name()
        ));
    }
    Ok(t)
}

/// Q16: q_out in the cache type.
fn q16(d: &Defines) -> Result<bool, String> {
    Ok(crate::defines::int_in(d, "Q16", &[0, 1])? == 1)
}

/// A cache value as stored and read back.
fn kv_round(t: KvType, v: f32) -> f32 {
    match t {
        KvType::F32 => v,
        KvType::F16 => f16_to_f32(f32_to_f16(v)),
        KvType::Bf16 => bf16_to_f32(f32_to_bf16(v)),
    }
}

/// Blocks per token of the warp-per-row kernel (ALGO 1): one while the
/// tokens alone give every SM two blocks (each token's angles computed
/// once), else enough that every row has a warp of its own (a call of a few
/// tokens is latency-bound: a warp that runs several rows in turn sets its
/// time).
fn row_blocks(a: &AttnProblem, warps: u32, lim: &DeviceLimits) -> u32 {
    if a.n_q >= 2 * lim.sm_count as usize {
        return 1;
    }
    ((a.n_heads + 2 * a.n_kv_heads) as u32).div_ceil(warps)
}

impl Family for QkNormRope {
    fn name(&self) -> &'static str {
        "qk_norm_rope"
    }
    fn entry(&self) -> &'static str {
        "qk_norm_rope"
    }
    fn source_file(&self) -> &'static str {
        "qk_norm_rope.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Attention
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = Defines::new();
        d.insert("KV_TYPE".into(), "F16".into());
        d.insert("Q16".into(), 0i64.into());
        d.insert("HEAD_DIM".into(), 256i64.into());
        d.insert("ALGO".into(), 0i64.into());
        d.insert("WARPS".into(), 4i64.into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match get_str(d, "KV_TYPE").as_deref() {
            Ok("F32") => Contract::Fp,
            _ => Contract::Approx,
        }
    }
    fn default_tolerance(&self, d: &Defines, _p: &Problem) -> Tolerance {
        // Q is f32 (or, Q16, rounded like K/V); K/V are rounded to the
        // cache type, where one ulp of the type is the bound (the reference
        // rounds too).
        let u = match get_str(d, "KV_TYPE").as_deref() {
            Ok("F16") => f64::powi(2.0, -11),
            Ok("BF16") => f64::powi(2.0, -8),
            _ => 1e-6,
        };
        Tolerance {
            rms_rel: u.max(1e-6),
            max_rel: 4.0 * u.max(1e-6),
            outlier_frac: 0.0,
            replay_rms_rel: u.max(1e-6),
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let a = attn_of(p)?;
        a.check()?;
        let t = kv_type(d, a)?;
        if q16(d)? && t == KvType::F32 {
            return Err("Q16=1 writes Q in the cache type, which must be F16 or BF16".into());
        }
        let hd = crate::defines::get_int(d, "HEAD_DIM")?;
        if hd != a.head_dim as i64 {
            return Err(format!(
                "HEAD_DIM={hd} does not match the shape's head_dim {}",
                a.head_dim
            ));
        }
        if a.n_q > a.capacity {
            return Err(format!(
                "{} tokens in one call would write {} cache slots twice",
                a.n_q,
                a.n_q - a.capacity
            ));
        }
        if crate::defines::int_in(d, "ALGO", &[0, 1])? == 1 {
            // A block per token, a warp per row; lanes take 16-byte pieces.
            let warps = crate::defines::int_in(d, "WARPS", &[4, 8, 16])? as u32;
            if a.head_dim % 256 != 0 {
                return Err(format!(
                    "ALGO=1 takes head_dim a multiple of 256 (a lane's pairs in 16-byte pieces), not {}",
                    a.head_dim
                ));
            }
            if a.n_q > i32::MAX as usize {
                return Err(format!("{} tokens exceed grid.x", a.n_q));
            }
            return Ok(LaunchGeometry {
                kernel: "qk_norm_rope".into(),
                grid: (a.n_q as u32, row_blocks(a, warps, lim), 1),
                block: (32 * warps, 1, 1),
                dyn_smem: 0,
            });
        }
        let half = a.head_dim / 2;
        if a.head_dim % 64 != 0 || half > 512 || half > lim.max_threads_per_block as usize {
            return Err(format!(
                "head_dim {} must be a multiple of 64 with hd/2 <= 512 threads",
                a.head_dim
            ));
        }
        if a.n_q > 65535 {
            return Err(format!("{} tokens exceed grid.y's 65535", a.n_q));
        }
        Ok(LaunchGeometry {
            kernel: "qk_norm_rope".into(),
            grid: ((a.n_heads + a.n_kv_heads) as u32, a.n_q as u32, 1),
            block: (half as u32, 1, 1),
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
        let a = *attn_of(p).map_err(GpuError::Rejected)?;
        let t = kv_type(d, &a).map_err(GpuError::Rejected)?;
        let q16 = q16(d).map_err(GpuError::Rejected)?;
        let (hd, nq, nkv, tn, cap) = (a.head_dim, a.n_heads, a.n_kv_heads, a.n_q, a.capacity);
        let half = hd / 2;
        let width = (nq + 2 * nkv) * hd;
        let mut rng = rng_for(self.name(), &[hd, nq, nkv, tn, cap, a.q_pos0], seed);
        let qkv = random_matrix(&mut rng, tn, width);
        let q_norm: Vec<f32> = (0..hd).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let k_norm: Vec<f32> = (0..hd).map(|_| rng.random_range(0.08f32..0.2)).collect();
        let inv = gemma4_inv_freq(hd);
        let kvw = cap * nkv * hd;
        // Caches start as random stored values of the type.
        let k0: Vec<f32> = (0..kvw)
            .map(|_| kv_round(t, rng.random_range(-1f32..1.0)))
            .collect();
        let v0: Vec<f32> = (0..kvw)
            .map(|_| kv_round(t, rng.random_range(-1f32..1.0)))
            .collect();

        // Reference: f64 norms and rotation, K/V rounded to the cache type.
        let norm_rope = |x: &[f32], w: Option<&[f32]>, pos: usize, rope: bool| -> Vec<f64> {
            let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
            let s = 1.0 / (ss / hd as f64 + EPS as f64).sqrt();
            let n: Vec<f64> = (0..hd)
                .map(|i| x[i] as f64 * s * w.map_or(1.0, |w| w[i] as f64))
                .collect();
            if !rope {
                return n;
            }
            let mut o = n.clone();
            for i in 0..half {
                let ang = pos as f64 * inv[i];
                let (c, sn) = (ang.cos() as f32 as f64, ang.sin() as f32 as f64);
                o[i] = n[i] * c - n[i + half] * sn;
                o[i + half] = n[i] * sn + n[i + half] * c;
            }
            o
        };
        let mut q_ref = vec![0f64; tn * nq * hd];
        let mut k_ref: Vec<f64> = k0.iter().map(|&v| v as f64).collect();
        let mut v_ref: Vec<f64> = v0.iter().map(|&v| v as f64).collect();
        for tt in 0..tn {
            let pos = a.q_pos0 + tt;
            let row = &qkv[tt * width..(tt + 1) * width];
            for h in 0..nq {
                let mut o = norm_rope(&row[h * hd..(h + 1) * hd], Some(&q_norm), pos, true);
                if q16 {
                    o.iter_mut()
                        .for_each(|x| *x = kv_round(t, *x as f32) as f64);
                }
                q_ref[(tt * nq + h) * hd..(tt * nq + h + 1) * hd].copy_from_slice(&o);
            }
            let slot = pos % cap;
            for g in 0..nkv {
                let kb = (nq + g) * hd;
                let vb = (nq + nkv + g) * hd;
                let ko = norm_rope(&row[kb..kb + hd], Some(&k_norm), pos, true);
                let vo = norm_rope(&row[vb..vb + hd], None, pos, false);
                let at = (slot * nkv + g) * hd;
                for i in 0..hd {
                    k_ref[at + i] = kv_round(t, ko[i] as f32) as f64;
                    v_ref[at + i] = kv_round(t, vo[i] as f32) as f64;
                }
            }
        }
        let mut reference = q_ref;
        reference.extend(k_ref);
        reference.extend(v_ref);

        let upload_kv = |v: &[f32]| -> Result<crate::gpu::DeviceBuffer, GpuError> {
            match t {
                KvType::F32 => gpu.upload(v),
                KvType::F16 => gpu.upload(&v.iter().map(|&x| f32_to_f16(x)).collect::<Vec<_>>()),
                KvType::Bf16 => gpu.upload(&v.iter().map(|&x| f32_to_bf16(x)).collect::<Vec<_>>()),
            }
        };
        let inp = gpu.upload(&qkv)?;
        let qn = gpu.upload(&q_norm)?;
        let kn = gpu.upload(&k_norm)?;
        let fr = gpu.upload(&inv)?;
        let pos = gpu.upload(&[a.q_pos0 as i32])?;
        let q_bytes = tn * nq * hd * if q16 { t.bytes() } else { 4 };
        let q_out = gpu.alloc(q_bytes)?;
        let kc = upload_kv(&k0)?;
        let vc = upload_kv(&v0)?;
        let args = QkNormRopeArgs {
            q_in: inp.ptr(),
            q_stride: width,
            k_in: inp.ptr() + 4 * (nq * hd) as u64,
            k_stride: width,
            v_in: inp.ptr() + 4 * ((nq + nkv) * hd) as u64,
            v_stride: width,
            q_norm: qn.ptr(),
            k_norm: kn.ptr(),
            inv_freq: fr.ptr(),
            pos0: pos.ptr(),
            q_out: q_out.ptr(),
            k_cache: kc.ptr(),
            v_cache: vc.ptr(),
            capacity: cap,
            rows: tn,
            n_heads: nq,
            n_kv_heads: nkv,
            eps: EPS,
        }
        .kargs();
        let read = |n: usize| match t {
            KvType::F32 => OutRead::F32,
            KvType::F16 => OutRead::Half { bf16: false, n },
            KvType::Bf16 => OutRead::Half { bf16: true, n },
        };
        let (k_pristine, v_pristine) = (upload_kv(&k0)?, upload_kv(&v0)?);
        let written = (tn * nkv * hd * 2 * t.bytes()) as u64;
        Ok(Box::new(RowsWorkload {
            args,
            bufs: vec![inp, qn, kn, fr, pos, q_out, kc, vc],
            outputs: vec![
                (
                    5,
                    if q16 {
                        read(tn * nq * hd)
                    } else {
                        OutRead::F32
                    },
                ),
                (6, read(kvw)),
                (7, read(kvw)),
            ],
            restore: vec![(6, k_pristine), (7, v_pristine)],
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (reference.clone(), None)),
            bytes: (tn * width * 4 + q_bytes) as u64 + written,
            ops: (tn * width * 8) as u64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;

    fn p(hd: usize, nq: usize, nkv: usize, t: usize, cap: usize) -> Problem {
        Problem::Attention(AttnProblem {
            n_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            window: 0,
            q_pos0: 0,
            n_q: t,
            capacity: cap,
            kv_type: KvType::F16,
        })
    }

    #[test]
    fn proportional_rope_rotates_64_pairs_of_512() {
        let f = gemma4_inv_freq(512);
        assert_eq!(f.len(), 256);
        assert_eq!(f[0], 1.0);
        // Past the 64th pair the 1e30 factor leaves an angle below 1e-30 per position.
        assert!(f[63] > 1e-3 && f[64] < 1e-30 && f[255] < 1e-30);
        let g = gemma4_inv_freq(256);
        assert!((g[1] - 1e4f64.powf(-2.0 / 256.0)).abs() < 1e-15);
    }

    #[test]
    fn validate_rejects_mismatched_types_and_overfull_calls() {
        let f = QkNormRope;
        let lim = DeviceLimits::for_arch(Arch(90));
        let mut d = f.default_defines(GgmlType::F16);
        // HEAD_DIM is bound from the shape; a define that disagrees is refused.
        assert!(f.validate(&d, &p(512, 8, 2, 7, 64), &lim).is_err());
        d.insert("HEAD_DIM".into(), 512i64.into());
        let g = f.validate(&d, &p(512, 8, 2, 7, 64), &lim).expect("valid");
        assert_eq!((g.grid, g.block.0), ((10, 7, 1), 256));
        d.insert("HEAD_DIM".into(), 256i64.into());
        assert!(f.validate(&d, &p(256, 8, 2, 70, 64), &lim).is_err());
        let mut d32 = d.clone();
        d32.insert("KV_TYPE".into(), "F32".into());
        assert!(f.validate(&d32, &p(256, 8, 2, 7, 64), &lim).is_err());
        // Q16 writes Q in a 16-bit cache type only.
        let mut q16 = d.clone();
        q16.insert("Q16".into(), 1i64.into());
        assert!(f.validate(&q16, &p(256, 8, 2, 7, 64), &lim).is_ok());
        let mut p32 = p(256, 8, 2, 7, 64);
        if let Problem::Attention(a) = &mut p32 {
            a.kv_type = KvType::F32;
        }
        q16.insert("KV_TYPE".into(), "F32".into());
        let e = f.validate(&q16, &p32, &lim).unwrap_err();
        assert!(e.contains("Q16=1"), "{e}");
    }

    #[test]
    fn warp_per_row_kernel_takes_a_block_per_token_and_whole_256_dim_pieces() {
        let f = QkNormRope;
        let lim = DeviceLimits::for_arch(Arch(90));
        let mut d = f.default_defines(GgmlType::F16);
        d.insert("ALGO".into(), 1i64.into());
        d.insert("WARPS".into(), 8i64.into());
        for hd in [256usize, 512] {
            d.insert("HEAD_DIM".into(), (hd as i64).into());
            // 2048 tokens: past ALGO 0's grid.y limit, one block each here.
            let g = f
                .validate(&d, &p(hd, 8, 2, 2048, 4096), &lim)
                .expect("valid");
            assert_eq!(
                (g.grid, g.block, g.dyn_smem),
                ((2048, 1, 1), (256, 1, 1), 0)
            );
            // A decode step: its 8 + 2 + 2 rows over two blocks of 8 warps.
            let g = f.validate(&d, &p(hd, 8, 2, 1, 4096), &lim).expect("valid");
            assert_eq!(g.grid, (1, 2, 1));
        }
        d.insert("HEAD_DIM".into(), 128i64.into());
        let e = f.validate(&d, &p(128, 8, 2, 7, 64), &lim).unwrap_err();
        assert!(e.contains("multiple of 256"), "{e}");
        d.insert("HEAD_DIM".into(), 256i64.into());
        d.insert("WARPS".into(), 5i64.into());
        assert!(f.validate(&d, &p(256, 8, 2, 7, 64), &lim).is_err());
        d.insert("WARPS".into(), 4i64.into());
        d.insert("ALGO".into(), 2i64.into());
        assert!(f.validate(&d, &p(256, 8, 2, 7, 64), &lim).is_err());
    }
}
