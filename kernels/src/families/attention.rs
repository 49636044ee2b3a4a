//! What the two attention families share (kernels/cuda/attn_prefill.cu,
//! attn_decode.cu, attn_core.cuh, attn_scalar.cuh): define checks, launch
//! geometry, the analytic count of visited KV tiles, seeded inputs in the
//! engine's cache layout, and the f64 oracle with its replay.

use super::rows_common::{act_replay, out_format, OutRead, RowsWorkload};
use super::{memo, random_matrix, rng_for};
use crate::bind::attention::{AttnArgs, MAX_SPLITS};
use crate::bind::ActFormat;
use crate::defines::{get_int, get_str, Defines};
use crate::device::{DeviceLimits, LaunchGeometry, LaunchSequence};
use crate::gpu::{Gpu, GpuError};
use crate::oracle::{attention, AttnParams};
use crate::problem::{attn_of, AttnProblem, KvType, Problem};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::verdict::{Contract, Tolerance};

/// The tensor-core tile configuration of a variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tile {
    pub bq: usize,
    pub bkv: usize,
    /// Dim warps (mma.sync) or dim warpgroups (wgmma).
    pub wd: usize,
    pub stages: usize,
    /// The Hopper loop of attn_wgmma.cuh (ALGO = 2) instead of attn_core.cuh.
    pub wgmma: bool,
    /// PERSIST (wgmma only): the work-item schedule.
    pub persist: Persist,
}

/// The wgmma loop's schedule of work items (query tile, KV head).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Persist {
    /// PERSIST = 0: one CTA per work item.
    No,
    /// PERSIST = 1: about one CTA per SM runs the items in turn; the next
    /// item's f32 Q is staged during the band into a second Q tile.
    TwoQ,
    /// PERSIST = 2 (Q16 = 1): the same schedule with one Q tile; the next
    /// item's Q is copied over it once the band's last S has read it.
    OneQ,
}

impl Persist {
    /// A grid of about one CTA per SM instead of one per item.
    pub fn persistent(self) -> bool {
        self != Persist::No
    }
}

/// How a prefill variant's q and out are stored (Q16, OUT).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefillIo {
    /// Q16 = 1: q in the cache type (f16 / bf16) instead of f32.
    pub q16: bool,
    /// OUT: f32, or the output projection's DQ_F16 / DQ_BF16 operand.
    pub out: ActFormat,
}

impl PrefillIo {
    /// f32 in and out: every kernel's convention, the only one of decode.
    pub const F32: PrefillIo = PrefillIo {
        q16: false,
        out: ActFormat::F32,
    };
    /// Q16 and OUT of a prefill variant's defines.
    pub fn read(d: &Defines) -> Result<PrefillIo, String> {
        let q16 = crate::defines::int_in(d, "Q16", &[0, 1])? == 1;
        let out = out_format(d)?;
        if matches!(out, ActFormat::Q8_1 | ActFormat::Q8Split) {
            return Err(format!(
                "OUT={}: attention writes F32, DQ_F16 or DQ_BF16",
                out.define()
            ));
        }
        Ok(PrefillIo { q16, out })
    }
}

impl Tile {
    pub fn threads(&self) -> usize {
        if self.wgmma {
            self.bq / 64 * self.wd * 128
        } else {
            self.bq / 16 * self.wd * 32
        }
    }
    /// ATTN_SMEM_BYTES of attn_core.cuh / attn_wgmma.cuh.
    pub fn smem_bytes(&self, hd: usize) -> usize {
        if self.wgmma {
            let exchange = if self.wd == 2 {
                self.threads() * self.bkv / 2 * 4
            } else {
                0
            };
            // PERSIST = 1: a second Q tile, and two 32-byte Q staging slots per thread.
            let (q_tiles, staging) = if self.persist == Persist::TwoQ {
                (2, 2 * self.threads() * 32)
            } else {
                (1, 0)
            };
            return 1024
                + q_tiles * self.bq * hd * 2
                + self.stages * 4 * self.bkv * hd
                + exchange
                + staging;
        }
        let qs = hd + 8;
        (self.bq * qs + 2 * self.stages * self.bkv * qs) * 2
            + self.bq * (self.bkv + 4) * 4
            + self.bq * (self.bkv + 8) * 2
            + 3 * self.bq * 4
    }
    /// The tile's rows hold whole GQA groups of the problem.
    fn check_group(&self, p: &AttnProblem) -> Result<(), String> {
        let g = p.group();
        if g > self.bq || self.bq % g != 0 {
            return Err(format!(
                "BQ={} rows do not hold whole GQA groups of {g} heads",
                self.bq
            ));
        }
        Ok(())
    }
    /// Its threads and shared memory fit one block of the device.
    fn check_fits(&self, hd: usize, lim: &DeviceLimits) -> Result<(), String> {
        if self.threads() > lim.max_threads_per_block as usize {
            return Err(format!("{} threads per block", self.threads()));
        }
        let smem = self.smem_bytes(hd);
        if smem > lim.max_smem_per_block as usize {
            return Err(format!(
                "needs {smem} bytes of shared memory, the {} limit is {}",
                lim.arch, lim.max_smem_per_block
            ));
        }
        Ok(())
    }
}

/// The variant's algorithm: the scalar kernel or the tensor-core tiles.
#[derive(Debug)]
pub enum Algo {
    Scalar { warps: usize },
    Mma(Tile),
}

fn int_of(d: &Defines, k: &str, allowed: &[i64]) -> Result<usize, String> {
    crate::defines::int_in(d, k, allowed).map(|v| v as usize)
}

/// The cache type the variant reads (bound to the shape's).
pub fn kv_type(d: &Defines, p: &AttnProblem) -> Result<KvType, String> {
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

/// The problem's consistency, and the HEAD_DIM and KV_TYPE defines bound
/// to it (every attention kernel's first checks).
pub fn head_dim_and_cache(d: &Defines, p: &AttnProblem) -> Result<(usize, KvType), String> {
    p.check()?;
    let hd = get_int(d, "HEAD_DIM")? as usize;
    if hd != p.head_dim {
        return Err(format!(
            "HEAD_DIM={hd} does not match the shape's head dim {}",
            p.head_dim
        ));
    }
    if hd % 32 != 0 || hd > 1024 {
        return Err(format!("head dim {hd} must be a multiple of 32 up to 1024"));
    }
    Ok((hd, kv_type(d, p)?))
}

/// Checks the defines shared by both families against the problem (the
/// decode kernel has no wgmma loop: ALGO = 2 is prefill's, `read_prefill`).
pub fn read(d: &Defines, p: &AttnProblem, lim: &DeviceLimits) -> Result<Algo, String> {
    read_algo(d, p, lim, false)
}

/// As `read`, with the prefill kernel's wgmma loop (ALGO = 2) allowed.
pub fn read_prefill(d: &Defines, p: &AttnProblem, lim: &DeviceLimits) -> Result<Algo, String> {
    read_algo(d, p, lim, true)
}

/// The one architecture whose wgmma the ALGO = 2 loop uses (`sm_90a`).
pub const WGMMA_ARCH: crate::compile::Arch = crate::compile::Arch(90);

fn read_algo(
    d: &Defines,
    p: &AttnProblem,
    lim: &DeviceLimits,
    wgmma_ok: bool,
) -> Result<Algo, String> {
    let (hd, kv) = head_dim_and_cache(d, p)?;
    match get_int(d, "ALGO")? {
        0 => {
            let w = crate::defines::int_range(d, "SCALAR_WARPS", 1, 32)? as usize;
            Ok(Algo::Scalar { warps: w })
        }
        1 => {
            if kv == KvType::F32 {
                return Err(
                    "the tensor-core kernel reads F16 or BF16 caches; ALGO=0 reads F32".into(),
                );
            }
            let t = Tile {
                bq: int_of(d, "BQ", &[16, 32, 64, 128])?,
                bkv: int_of(d, "BKV", &[32, 64])?,
                wd: int_of(d, "WD", &[1, 2, 4])?,
                stages: int_of(d, "STAGES", &[1, 2])?,
                wgmma: false,
                persist: Persist::No,
            };
            int_of(d, "CP_ASYNC", &[0, 1])?;
            t.check_group(p)?;
            if t.bkv / t.wd < 8 || (hd / t.wd) % 16 != 0 {
                return Err(format!(
                    "WD={} leaves {} S columns / {} head dims per warp (need >= 8 / a multiple of 16)",
                    t.wd,
                    t.bkv / t.wd,
                    hd / t.wd
                ));
            }
            if hd / t.wd / 2 > 128 {
                return Err(format!(
                    "{} f32 O accumulators per thread would not fit in registers (raise WD)",
                    hd / t.wd / 2
                ));
            }
            t.check_fits(hd, lim)?;
            Ok(Algo::Mma(t))
        }
        2 if wgmma_ok => read_wgmma(d, p, lim, hd, kv),
        a if wgmma_ok => Err(format!("ALGO={a} is not 0, 1 or 2")),
        a => Err(format!("ALGO={a} is not 0 or 1")),
    }
}

/// The wgmma tile (ALGO = 2): 64-row warpgroups, WD of them per 64 rows
/// splitting the head dim into slices of 128 or 256 (the wgmma N of PV).
fn read_wgmma(
    d: &Defines,
    p: &AttnProblem,
    lim: &DeviceLimits,
    hd: usize,
    kv: KvType,
) -> Result<Algo, String> {
    if lim.arch != WGMMA_ARCH {
        return Err(format!(
            "wgmma needs {WGMMA_ARCH}a (Hopper); the target is {}",
            lim.arch
        ));
    }
    if kv == KvType::F32 {
        return Err("the wgmma kernel reads F16 or BF16 caches; ALGO=0 reads F32".into());
    }
    if int_of(d, "CP_ASYNC", &[0, 1])? != 1 {
        return Err("the wgmma kernel stages K/V with cp.async (CP_ASYNC=1)".into());
    }
    let t = Tile {
        bq: int_of(d, "BQ", &[64, 128])?,
        bkv: int_of(d, "BKV", &[32, 64, 128])?,
        wd: int_of(d, "WD", &[1, 2])?,
        stages: int_of(d, "STAGES", &[1, 2])?,
        wgmma: true,
        persist: match int_of(d, "PERSIST", &[0, 1, 2])? {
            1 => Persist::TwoQ,
            2 => Persist::OneQ,
            _ => Persist::No,
        },
    };
    t.check_group(p)?;
    if t.persist.persistent() && t.stages != 2 {
        return Err("PERSIST runs the two-stage loop (STAGES=2)".into());
    }
    let slice = hd / t.wd;
    if hd % t.wd != 0 || (slice != 128 && slice != 256) {
        return Err(format!(
            "WD={} leaves head-dim slices of {slice} (the wgmma kernel needs 128 or 256)",
            t.wd
        ));
    }
    t.check_fits(hd, lim)?;
    Ok(Algo::Mma(t))
}

/// Query tokens per CTA of the tensor-core kernel.
pub fn tokens_per_cta(t: &Tile, p: &AttnProblem) -> usize {
    t.bq / p.group()
}

/// KV splits of the decode kernel: SPLITS, or (0) enough CTAs to fill the
/// device twice over at the planned length, at most one per KV tile.
pub fn splits(d: &Defines, t: &Tile, p: &AttnProblem, lim: &DeviceLimits) -> Result<usize, String> {
    let s = crate::defines::int_range(d, "SPLITS", 0, MAX_SPLITS as i64)? as usize;
    if s > 0 {
        return Ok(s);
    }
    let keys = if p.window > 0 {
        (p.window + p.n_q).min(p.kv_len())
    } else {
        p.kv_len()
    };
    let tiles = keys.div_ceil(t.bkv) + 1;
    let ctas = p.n_q.div_ceil(tokens_per_cta(t, p)) * p.n_kv_heads;
    let want = (2 * lim.sm_count as usize).div_ceil(ctas.max(1));
    Ok(want.min(tiles).clamp(1, MAX_SPLITS))
}

/// CTAs of one tile that fit an SM at once by shared memory and threads
/// (1 KiB per CTA is the driver's reservation).
pub fn ctas_per_sm(smem: usize, threads: usize, lim: &DeviceLimits) -> usize {
    ((lim.max_smem_per_block as usize + 1024) / (smem + 1024)).clamp(1, 2048 / threads.max(1))
}

/// The launch of a validated variant (`z` KV splits; 1 for prefill). A
/// persistent tile gets one CTA per item up to what the device holds at once.
pub fn geometry(
    entry: &str,
    algo: &Algo,
    p: &AttnProblem,
    z: usize,
    lim: &DeviceLimits,
) -> LaunchGeometry {
    match algo {
        Algo::Scalar { warps } => LaunchGeometry {
            kernel: entry.into(),
            grid: ((p.n_q * p.n_heads).div_ceil(*warps) as u32, 1, 1),
            block: ((warps * 32) as u32, 1, 1),
            dyn_smem: 0,
        },
        Algo::Mma(t) if t.persist.persistent() => {
            let items = p.n_q.div_ceil(tokens_per_cta(t, p)) * p.n_kv_heads;
            let smem = t.smem_bytes(p.head_dim);
            let resident = lim.sm_count as usize * ctas_per_sm(smem, t.threads(), lim);
            LaunchGeometry {
                kernel: entry.into(),
                grid: (items.min(resident) as u32, 1, z as u32),
                block: (t.threads() as u32, 1, 1),
                dyn_smem: smem as u32,
            }
        }
        Algo::Mma(t) => LaunchGeometry {
            kernel: entry.into(),
            grid: (
                p.n_q.div_ceil(tokens_per_cta(t, p)) as u32,
                p.n_kv_heads as u32,
                z as u32,
            ),
            block: (t.threads() as u32, 1, 1),
            dyn_smem: t.smem_bytes(p.head_dim) as u32,
        },
    }
}

/// KV tiles the tensor-core kernel visits in total (all CTAs, all splits),
/// from positions alone: the proof the windowed kernel skips tiles.
pub fn visited_tiles(t: &Tile, p: &AttnProblem, windowed: bool) -> u64 {
    let per = tokens_per_cta(t, p);
    let cache_lo = p.kv_len().saturating_sub(p.capacity);
    let mut n = 0u64;
    let mut t0 = 0;
    while t0 < p.n_q {
        let n_tok = per.min(p.n_q - t0);
        let p_lo = p.q_pos0 + t0;
        let p_hi = p_lo + n_tok - 1;
        let k_lo = if windowed && p.window > 0 {
            cache_lo.max((p_lo + 1).saturating_sub(p.window))
        } else {
            cache_lo
        };
        n += (p_hi / t.bkv - k_lo / t.bkv + 1) as u64;
        t0 += per;
    }
    n * p.n_kv_heads as u64
}

/// The contract of a variant.
pub fn contract(d: &Defines) -> Contract {
    match get_int(d, "ALGO") {
        Ok(1 | 2) => Contract::Approx,
        _ => Contract::Fp,
    }
}

/// Tolerances: f32 throughout for the scalar kernel; operand rounding to
/// f16 / bf16 for the tensor-core one (Q, K, V and P rounded; the replay
/// rounds Q too, leaving P's rounding and the f32 sums).
pub fn tolerance(d: &Defines, p: &Problem) -> Tolerance {
    let kv = attn_of(p).map(|a| a.kv_type).unwrap_or(KvType::F16);
    match (contract(d), kv) {
        (Contract::Approx, KvType::Bf16) => Tolerance {
            rms_rel: 3e-2,
            max_rel: 0.2,
            outlier_frac: 1e-3,
            replay_rms_rel: 1.5e-2,
        },
        (Contract::Approx, _) => Tolerance {
            rms_rel: 4e-3,
            max_rel: 4e-2,
            outlier_frac: 1e-3,
            replay_rms_rel: 2e-3,
        },
        _ => Tolerance {
            rms_rel: 1e-5,
            max_rel: 1e-4,
            outlier_frac: 0.0,
            replay_rms_rel: 1e-5,
        },
    }
}

fn store(t: KvType, v: f32) -> f32 {
    match t {
        KvType::F32 => v,
        KvType::F16 => f16_to_f32(f32_to_f16(v)),
        KvType::Bf16 => bf16_to_f32(f32_to_bf16(v)),
    }
}

/// Seeded inputs of a problem: q, and every cache slot filled (as stored).
pub struct AttnInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

pub fn inputs(p: &AttnProblem, seed: u64) -> std::sync::Arc<AttnInputs> {
    let key = format!("attn inputs {p:?} {seed}");
    memo::get(key, || {
        let dims = [
            p.n_heads,
            p.n_kv_heads,
            p.head_dim,
            p.window,
            p.q_pos0,
            p.n_q,
            p.capacity,
        ];
        let mut rng = rng_for("attention", &dims, seed);
        // Scores O(1-3) as with Gemma 4's normed q and k (k norms ~0.12).
        let q: Vec<f32> = random_matrix(&mut rng, p.n_q * p.n_heads, p.head_dim)
            .into_iter()
            .map(|x| x * 0.2)
            .collect();
        let w = p.n_kv_heads * p.head_dim;
        let k: Vec<f32> = random_matrix(&mut rng, p.capacity, w)
            .into_iter()
            .map(|x| store(p.kv_type, x * 0.5))
            .collect();
        let v: Vec<f32> = random_matrix(&mut rng, p.capacity, w)
            .into_iter()
            .map(|x| store(p.kv_type, x))
            .collect();
        AttnInputs { q, k, v }
    })
}

/// The f64 oracle over the keys still cached, with `q` as given.
pub fn oracle(p: &AttnProblem, inp: &AttnInputs, q: &[f32]) -> Vec<f64> {
    let kv_len = p.kv_len();
    let lo = kv_len.saturating_sub(p.capacity);
    let w = p.n_kv_heads * p.head_dim;
    let k_pos: Vec<usize> = (lo..kv_len).collect();
    let mut k = Vec::with_capacity(k_pos.len() * w);
    let mut v = Vec::with_capacity(k_pos.len() * w);
    for &kp in &k_pos {
        let s = kp % p.capacity;
        k.extend_from_slice(&inp.k[s * w..(s + 1) * w]);
        v.extend_from_slice(&inp.v[s * w..(s + 1) * w]);
    }
    let q_pos: Vec<usize> = (p.q_pos0..kv_len).collect();
    let params = AttnParams {
        n_heads: p.n_heads,
        n_kv_heads: p.n_kv_heads,
        head_dim: p.head_dim,
        scale: 1.0,
        window: (p.window > 0).then_some(p.window),
    };
    // Split the query rows over threads: the oracle is per query row.
    use rayon::prelude::*;
    let rw = p.n_heads * p.head_dim;
    let mut out = vec![0f32; p.n_q * rw];
    out.par_chunks_mut(rw).enumerate().for_each(|(t, o)| {
        attention(
            &q[t * rw..(t + 1) * rw],
            &q_pos[t..t + 1],
            &k,
            &v,
            &k_pos,
            &params,
            o,
        );
    });
    out.into_iter().map(f64::from).collect()
}

fn upload_kv(gpu: &Gpu, t: KvType, v: &[f32]) -> Result<crate::gpu::DeviceBuffer, GpuError> {
    match t {
        KvType::F32 => gpu.upload(v),
        KvType::F16 => gpu.upload(&v.iter().map(|&x| f32_to_f16(x)).collect::<Vec<_>>()),
        KvType::Bf16 => gpu.upload(&v.iter().map(|&x| f32_to_bf16(x)).collect::<Vec<_>>()),
    }
}

/// A checkable, timeable attention call, enqueued as `seq` says (the
/// family's `launch_sequence`, which the engine's launch follows too):
/// `Decode` reads pos0 from device memory and is a programmatic dependent,
/// with the combine after it when `combine`. `io`: how q and out are
/// stored (`PrefillIo::F32` for decode).
pub fn workload(
    gpu: &Gpu,
    d: &Defines,
    p: &Problem,
    geo: &LaunchGeometry,
    seed: u64,
    seq: LaunchSequence,
    io: PrefillIo,
) -> Result<Box<dyn crate::workload::Workload>, GpuError> {
    let a = *attn_of(p).map_err(GpuError::Rejected)?;
    let (decode, combine) = match seq {
        LaunchSequence::Single => (false, false),
        LaunchSequence::Decode { combine } => (true, combine),
    };
    // Every ALGO but the scalar one rounds Q (and P) to the cache type.
    let tensor_cores = get_int(d, "ALGO").map_err(GpuError::Rejected)? != 0;
    let inp = inputs(&a, seed);
    let op = tensor_cores.then_some(a.kv_type);
    // Q16: q as stored in the cache type, the rounding the kernels apply
    // to f32 q themselves (so the reference and replay are unchanged).
    let q_bufs = if io.q16 {
        upload_kv(gpu, a.kv_type, &inp.q)?
    } else {
        gpu.upload(&inp.q)?
    };
    let kc = upload_kv(gpu, a.kv_type, &inp.k)?;
    let vc = upload_kv(gpu, a.kv_type, &inp.v)?;
    let n_out = a.n_q * a.n_heads * a.head_dim;
    let out = gpu.alloc(io.out.bytes(a.n_q, a.n_heads * a.head_dim))?;
    let pos = gpu.upload(&[a.q_pos0 as i32])?;
    let splits = geo.grid.2.max(1) as usize;
    let scratch_words = if decode {
        splits * a.n_q * a.n_heads * (a.head_dim + 2)
    } else {
        4
    };
    let scratch = gpu.alloc(scratch_words * 4)?;
    let args = AttnArgs {
        q: q_bufs.ptr(),
        k_cache: kc.ptr(),
        v_cache: vc.ptr(),
        out: out.ptr(),
        pos0_host: a.q_pos0,
        pos0_dev: if decode { pos.ptr() } else { 0 },
        n_q: a.n_q,
        capacity: a.capacity,
        n_heads: a.n_heads,
        n_kv_heads: a.n_kv_heads,
        window: a.window,
        scratch: scratch.ptr(),
    };
    let then = if combine {
        vec![(
            crate::bind::attention::combine_geometry(&a),
            crate::bind::attention::combine_kargs(&args, splits),
        )]
    } else {
        Vec::new()
    };
    let key = format!("attn ref {a:?} {seed}");
    let replay_key = format!("attn replay {a:?} {seed} {op:?}");
    let inp2 = inp.clone();
    let out_fmt = io.out;
    // The replay: the f64 oracle on the rounded Q, its output rounded to
    // OUT's type as the kernel rounds its f32 row.
    let reference: super::rows_common::RowsRef = Box::new(move || {
        let r = memo::get(key.clone(), || oracle(&a, &inp2, &inp2.q));
        let rp = op.map(|t| {
            let o = memo::get(replay_key.clone(), || {
                let qr: Vec<f32> = inp2.q.iter().map(|&x| store(t, x)).collect();
                oracle(&a, &inp2, &qr)
            });
            if out_fmt == ActFormat::F32 {
                (*o).clone()
            } else {
                let f: Vec<f32> = o.iter().map(|&x| x as f32).collect();
                act_replay(out_fmt, &f).into_iter().map(f64::from).collect()
            }
        });
        ((*r).clone(), rp)
    });
    // Bytes: q and out, and the K/V rows the visible keys occupy.
    let kv_keys = visible_keys(&a);
    let q_bytes = n_out * if io.q16 { a.kv_type.bytes() } else { 4 };
    let bytes = (q_bytes
        + io.out.bytes(a.n_q, a.n_heads * a.head_dim)
        + 2 * kv_keys * a.n_kv_heads * a.head_dim * a.kv_type.bytes()) as u64;
    let read_out = if io.out == ActFormat::F32 {
        OutRead::F32
    } else {
        OutRead::Act {
            format: io.out,
            scales: None,
            n: n_out,
        }
    };
    Ok(Box::new(RowsWorkload {
        bufs: vec![q_bufs, kc, vc, out, pos, scratch],
        outputs: vec![(3, read_out)],
        restore: Vec::new(),
        args: args.kargs(),
        geo: geo.clone(),
        then,
        // Decode is launched as the engine launches it (bind::attention::launch).
        dependent: decode,
        // The caches: K (buffer 1, argument 1) and V (2, 2).
        rotate: vec![(1, 1), (2, 2)],
        copies: Vec::new(),
        reference,
        bytes,
        ops: 4 * (a.head_dim * a.n_heads) as u64 * a.visible_pairs(),
    }))
}

/// Distinct key positions any query of the call can see.
pub fn visible_keys(a: &AttnProblem) -> usize {
    let lo_cache = a.kv_len().saturating_sub(a.capacity);
    let lo = if a.window > 0 {
        lo_cache.max((a.q_pos0 + 1).saturating_sub(a.window))
    } else {
        lo_cache
    };
    a.kv_len() - lo
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;

    fn prob(n_q: usize, q_pos0: usize, window: usize, cap: usize) -> AttnProblem {
        AttnProblem {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 256,
            window,
            q_pos0,
            n_q,
            capacity: cap,
            kv_type: KvType::F16,
        }
    }

    #[test]
    fn windowed_visits_only_the_band() {
        let t = Tile {
            bq: 64,
            bkv: 64,
            wd: 2,
            stages: 2,
            wgmma: false,
            persist: Persist::No,
        };
        // 4096 tokens from 0, window 512: 16 tokens per CTA (GQA 4).
        let p = prob(4096, 0, 512, 4096);
        let full = visited_tiles(&t, &p, false);
        let band = visited_tiles(&t, &p, true);
        // Windowed: CTA c starts at the tile of its first query's oldest
        // visible key, 16c - 511 (about 9 tiles instead of up to 64).
        let want_band: u64 = (0..256u64)
            .map(|c| (16 * c + 15) / 64 - (16 * c).saturating_sub(511) / 64 + 1)
            .sum::<u64>()
            * 2;
        assert_eq!(band, want_band, "band {band} vs full {full}");
        assert!(band * 3 < full, "band {band} vs full {full}");
        // Full causal: CTA c ends at tile (16c + 15) / 64, from tile 0.
        let want: u64 = (0..256u64).map(|c| (16 * c + 15) / 64 + 1).sum::<u64>() * 2;
        assert_eq!(full, want);
        // Without a window both visit the same tiles.
        let pf = prob(300, 100, 0, 400);
        assert_eq!(visited_tiles(&t, &pf, true), visited_tiles(&t, &pf, false));
    }

    #[test]
    fn tiles_that_cannot_fit_are_rejected() {
        let lim = DeviceLimits::for_arch(Arch(90));
        let mut d = Defines::new();
        for (k, v) in [
            ("ALGO", 1i64),
            ("HEAD_DIM", 512),
            ("SCALAR_WARPS", 4),
            ("BQ", 64),
            ("BKV", 64),
            ("WD", 2),
            ("STAGES", 2),
            ("CP_ASYNC", 1),
        ] {
            d.insert(k.into(), v.into());
        }
        d.insert("KV_TYPE".into(), "F16".into());
        let mut p = prob(64, 0, 0, 64);
        p.head_dim = 512;
        let e = read(&d, &p, &lim).expect_err("too much smem or registers");
        assert!(
            e.contains("shared memory") || e.contains("registers"),
            "{e}"
        );
        d.insert("BKV".into(), 32i64.into());
        d.insert("WD".into(), 4i64.into());
        assert!(read(&d, &p, &lim).is_ok());
        p.kv_type = KvType::F32;
        d.insert("KV_TYPE".into(), "F32".into());
        assert!(read(&d, &p, &lim).is_err());
    }

    fn wgmma_defines(hd: i64, bq: i64, bkv: i64, wd: i64, stages: i64) -> Defines {
        let mut d = Defines::new();
        for (k, v) in [
            ("ALGO", 2i64),
            ("HEAD_DIM", hd),
            ("SCALAR_WARPS", 4),
            ("BQ", bq),
            ("BKV", bkv),
            ("WD", wd),
            ("STAGES", stages),
            ("CP_ASYNC", 1),
            ("PERSIST", 0),
        ] {
            d.insert(k.into(), v.into());
        }
        d.insert("KV_TYPE".into(), "F16".into());
        d
    }

    #[test]
    fn wgmma_tiles_are_prefill_and_hopper_only_and_sized_like_the_kernel() {
        let h100 = DeviceLimits::for_arch(Arch(90));
        let p = prob(4096, 0, 512, 4096);
        let d = wgmma_defines(256, 128, 64, 1, 2);
        // The kernel's ATTN_SMEM_BYTES: slack + Q + 2 stages of K and V.
        match read_prefill(&d, &p, &h100).expect("the main profile's tile") {
            Algo::Mma(t) => {
                assert!(t.wgmma);
                assert_eq!(t.threads(), 256);
                assert_eq!(t.smem_bytes(256), 1024 + 128 * 256 * 2 + 2 * 4 * 64 * 256);
            }
            Algo::Scalar { .. } => panic!("ALGO=2 read as the scalar kernel"),
        }
        // Decode has no wgmma loop; other architectures have no wgmma.
        assert!(read(&d, &p, &h100).unwrap_err().contains("ALGO=2"));
        for arch in [80, 89] {
            let e = read_prefill(&d, &p, &DeviceLimits::for_arch(Arch(arch))).unwrap_err();
            assert!(e.contains("sm_90a"), "{e}");
        }
        // Head dim 512 needs two warpgroups per 64 rows (slices of 256),
        // plus the score exchange in shared memory.
        let mut p512 = p;
        p512.head_dim = 512;
        p512.window = 0;
        let e = read_prefill(&wgmma_defines(512, 64, 64, 1, 1), &p512, &h100).unwrap_err();
        assert!(e.contains("slices of 512"), "{e}");
        match read_prefill(&wgmma_defines(512, 64, 64, 2, 1), &p512, &h100).expect("hd 512") {
            Algo::Mma(t) => assert_eq!(
                t.smem_bytes(512),
                1024 + 64 * 512 * 2 + 4 * 64 * 512 + 256 * 32 * 4
            ),
            Algo::Scalar { .. } => panic!("ALGO=2 read as the scalar kernel"),
        }
        let e = read_prefill(&wgmma_defines(512, 64, 64, 2, 2), &p512, &h100).unwrap_err();
        assert!(e.contains("shared memory"), "{e}");
        // f32 caches and synchronous copies are the other kernels' business.
        let mut d32 = wgmma_defines(256, 128, 64, 1, 2);
        d32.insert("KV_TYPE".into(), "F32".into());
        let mut p32 = p;
        p32.kv_type = KvType::F32;
        assert!(read_prefill(&d32, &p32, &h100).unwrap_err().contains("F32"));
        let mut dsync = wgmma_defines(256, 128, 64, 1, 2);
        dsync.insert("CP_ASYNC".into(), 0i64.into());
        assert!(read_prefill(&dsync, &p, &h100)
            .unwrap_err()
            .contains("CP_ASYNC"));
    }

    #[test]
    fn persistent_tiles_hold_two_q_tiles_and_launch_at_most_one_cta_per_sm() {
        let h100 = DeviceLimits::for_arch(Arch(90));
        // 4096 tokens, 32 per item, 2 KV heads: 256 items on 132 SMs.
        let p = prob(4096, 0, 512, 4096);
        let mut d = wgmma_defines(256, 128, 32, 1, 2);
        d.insert("PERSIST".into(), 1i64.into());
        let algo = read_prefill(&d, &p, &h100).expect("the persistent window tile");
        let Algo::Mma(t) = &algo else {
            panic!("ALGO=2 read as the scalar kernel")
        };
        assert_eq!(t.persist, Persist::TwoQ);
        assert_eq!(
            t.smem_bytes(256),
            1024 + 2 * 128 * 256 * 2 + 2 * 4 * 32 * 256 + 2 * 256 * 32
        );
        let g = geometry("attn_prefill", &algo, &p, 1, &h100);
        assert_eq!(g.grid, (132, 1, 1));
        assert_eq!(g.dyn_smem as usize, t.smem_bytes(256));
        // Fewer items than SMs: one CTA per item.
        let short = prob(100, 0, 512, 100);
        let g = geometry("attn_prefill", &algo, &short, 1, &h100);
        assert_eq!(g.grid, (8, 1, 1));
        // A 64-key tile has no room for the second Q tile; one buffer per
        // stage has no band loop to hide the next item behind.
        d.insert("BKV".into(), 64i64.into());
        let e = read_prefill(&d, &p, &h100).unwrap_err();
        assert!(e.contains("shared memory"), "{e}");
        let mut d1 = wgmma_defines(256, 64, 64, 1, 1);
        d1.insert("PERSIST".into(), 1i64.into());
        assert!(read_prefill(&d1, &p, &h100)
            .unwrap_err()
            .contains("STAGES=2"));
    }
}
