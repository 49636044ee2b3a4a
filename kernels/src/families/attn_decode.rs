//! `attn_decode`: 1..8 query tokens over a long cache, split-KV on tensor
//! cores with a combine (flash-decoding: the prefill tile loop, ALGO 1, the
//! streaming kernel of attn_stream.cuh, ALGO 2, or its key-major form in
//! attn_keymajor.cuh, ALGO 3), or the scalar kernel;
//! graph-safe (the position comes from device memory). See
//! kernels/cuda/attn_decode.cu and `bind::attention`.

use super::attention;
use crate::bind::attention::MAX_SPLITS;
use crate::defines::{defines, get_int, Defines};
use crate::device::{DeviceLimits, LaunchGeometry, LaunchSequence};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{attn_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

pub struct AttnDecode;

/// Query tokens a decode call takes at most.
pub const MAX_TOKENS: usize = 8;

impl Family for AttnDecode {
    fn name(&self) -> &'static str {
        "attn_decode"
    }
    fn entry(&self) -> &'static str {
        "attn_decode"
    }
    fn source_file(&self) -> &'static str {
        "attn_decode.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Attention
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("ALGO", 1i64),
            ("HEAD_DIM", 256),
            ("SCALAR_WARPS", 4),
            ("BQ", 16),
            ("BKV", 64),
            ("KW", 1),
            ("QSPLIT", 0),
            ("WD", 4),
            ("STAGES", 2),
            ("CP_ASYNC", 1),
            ("BULK", 0),
            ("SPLITS", 0),
        ]);
        d.insert("KV_TYPE".into(), "F16".into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        attention::contract(&as_tile_loop(d))
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        attention::tolerance(&as_tile_loop(d), p)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let a = attn_of(p)?;
        if a.n_q > MAX_TOKENS {
            return Err(format!(
                "decode takes 1..={MAX_TOKENS} query tokens, not {}",
                a.n_q
            ));
        }
        if matches!(get_int(d, "ALGO")?, 2 | 3) {
            let t = stream_tile(d, a, lim)?;
            return Ok(stream_geometry(&t, a, stream_splits(d, &t, a, lim)?));
        }
        let algo = attention::read(d, a, lim)?;
        let z = match &algo {
            attention::Algo::Mma(t) => attention::splits(d, t, a, lim)?,
            attention::Algo::Scalar { .. } => 1,
        };
        Ok(attention::geometry("attn_decode", &algo, a, z, lim))
    }
    /// A programmatic dependent; every tensor-core ALGO splits the keys
    /// and has its partials combined, the scalar kernel (ALGO 0) does not.
    fn launch_sequence(&self, d: &Defines) -> Result<LaunchSequence, String> {
        Ok(LaunchSequence::Decode {
            combine: get_int(d, "ALGO")? != 0,
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
        let seq = self.launch_sequence(d).map_err(GpuError::Rejected)?;
        attention::workload(gpu, d, p, geo, seed, seq, attention::PrefillIo::F32)
    }
}

/// ALGO 2 and 3 round Q, K, V and P to the cache type and sum in f32 as
/// the tensor-core tile loop (ALGO 1) does, so they have that kernel's
/// contract and tolerances: the defines with ALGO 2 or 3 read as ALGO 1.
fn as_tile_loop(d: &Defines) -> std::borrow::Cow<'_, Defines> {
    match get_int(d, "ALGO") {
        Ok(2 | 3) => {
            let mut d1 = d.clone();
            d1.insert("ALGO".into(), 1i64.into());
            std::borrow::Cow::Owned(d1)
        }
        _ => std::borrow::Cow::Borrowed(d),
    }
}

/// The configuration of the streaming kernels (ALGO 2, attn_stream.cuh;
/// ALGO 3, attn_keymajor.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamTile {
    pub bq: usize,
    pub bkv: usize,
    pub kw: usize,
    pub wd: usize,
    pub stages: usize,
    /// QSPLIT: S computed over each dim warp's head dims and summed.
    pub qsplit: bool,
    /// ALGO 3: keys on the mma's M, rows on its N (S^T = K Q^T).
    pub key_major: bool,
    /// BULK (ALGO 3, sm_90): K/V rows by bulk copies on per-stage mbarriers.
    pub bulk: bool,
}

impl StreamTile {
    pub fn threads(&self) -> usize {
        self.kw * self.wd * 32
    }
    /// STREAM_SMEM_BYTES of attn_stream.cuh, KM_SMEM_BYTES of
    /// attn_keymajor.cuh.
    pub fn smem_bytes(&self, hd: usize) -> usize {
        let qs = hd + 8;
        let stages = 2 * self.stages * self.bkv * qs * 2;
        if self.key_major {
            let merge = (2 * self.kw * self.bq + self.bq * (hd + 4)) * 4;
            let bars = if self.bulk { 8 * self.stages } else { 0 };
            let sx = if self.qsplit && self.wd > 1 {
                self.kw * 2 * self.wd * (self.bq / 8) * 128 * 4
            } else {
                0
            };
            return self.bq * qs * 2 + stages.max(merge) + sx + bars;
        }
        let merge = (2 * self.kw * self.bq + self.bq * hd) * 4;
        let sx = if self.qsplit && self.wd > 1 {
            self.kw * 2 * self.wd * self.bq * 16 * 4
        } else {
            0
        };
        self.bq * qs * 2 + stages.max(merge) + sx
    }
}

fn int_of(d: &Defines, k: &str, allowed: &[i64]) -> Result<usize, String> {
    crate::defines::int_in(d, k, allowed).map(|v| v as usize)
}

/// Checks the streaming kernels' defines (ALGO 2 or 3) against the problem.
pub fn stream_tile(
    d: &Defines,
    p: &crate::problem::AttnProblem,
    lim: &DeviceLimits,
) -> Result<StreamTile, String> {
    let (hd, kv) = attention::head_dim_and_cache(d, p)?;
    if kv == crate::problem::KvType::F32 {
        return Err("the streaming kernel reads F16 or BF16 caches; ALGO=0 reads F32".into());
    }
    let key_major = get_int(d, "ALGO")? == 3;
    let t = StreamTile {
        bq: int_of(d, "BQ", if key_major { &[8, 16, 32] } else { &[16, 32] })?,
        bkv: int_of(d, "BKV", &[16, 32, 64])?,
        kw: int_of(d, "KW", &[1, 2, 4])?,
        wd: int_of(d, "WD", &[1, 2, 4, 8])?,
        stages: int_of(d, "STAGES", &[2, 3, 4])?,
        qsplit: int_of(d, "QSPLIT", &[0, 1])? == 1,
        key_major,
        bulk: int_of(d, "BULK", &[0, 1])? == 1,
    };
    if key_major && t.qsplit && (hd / t.wd) % 32 != 0 {
        return Err(format!(
            "QSPLIT with WD={} leaves {} head dims of S per warp (the key-major kernel needs a multiple of 32)",
            t.wd,
            hd / t.wd
        ));
    }
    if t.bulk && !key_major {
        return Err("BULK applies to ALGO=3".into());
    }
    if t.bulk && lim.arch.0 < 90 {
        return Err(format!(
            "BULK=1 uses cp.async.bulk, which needs sm_90; the target is {}",
            lim.arch
        ));
    }
    let g = p.group();
    if g > t.bq || t.bq % g != 0 {
        return Err(format!(
            "BQ={} rows do not hold whole GQA groups of {g} heads",
            t.bq
        ));
    }
    if (t.bkv / 16) % t.kw != 0 {
        return Err(format!(
            "KW={} warps do not split the {} 16-key sub-blocks of a tile evenly",
            t.kw,
            t.bkv / 16
        ));
    }
    if (hd / t.wd) % 16 != 0 {
        return Err(format!(
            "WD={} leaves {} head dims per warp (need a multiple of 16)",
            t.wd,
            hd / t.wd
        ));
    }
    let chunks = hd / 8;
    if t.threads() % chunks != 0 || (t.bkv * chunks) % t.threads() != 0 {
        return Err(format!(
            "{} threads do not copy a tile of {} keys x {chunks} 16-byte chunks evenly",
            t.threads(),
            t.bkv
        ));
    }
    if key_major {
        // f32 O^T accumulators per thread: HD/WD/16 m-tiles x BQ/8 n-tiles x 4.
        let acc = hd / t.wd / 16 * (t.bq / 8) * 4;
        if acc > 128 {
            return Err(format!(
                "{acc} f32 O accumulators per thread would not fit (raise WD or lower BQ)"
            ));
        }
        return check_smem(t, hd, lim);
    }
    // f32 O accumulators per thread: BQ/16 row groups x HD/WD/8 n-tiles x 4.
    let acc = t.bq / 16 * hd / t.wd / 2;
    // QSPLIT keeps this warp's Q fragments in registers as well.
    let q_regs = if t.qsplit {
        t.bq / 16 * hd / t.wd / 4
    } else {
        0
    };
    if acc > 64 || acc + q_regs > 128 {
        return Err(format!(
            "{acc} f32 O accumulators and {q_regs} Q fragment registers per thread would not fit (raise WD or lower BQ)"
        ));
    }
    check_smem(t, hd, lim)
}

fn check_smem(t: StreamTile, hd: usize, lim: &DeviceLimits) -> Result<StreamTile, String> {
    let smem = t.smem_bytes(hd);
    if smem > lim.max_smem_per_block as usize {
        return Err(format!(
            "needs {smem} bytes of shared memory, the {} limit is {}",
            lim.arch, lim.max_smem_per_block
        ));
    }
    Ok(t)
}

/// KV splits of the streaming kernel: SPLITS, or (0) about as many CTAs as
/// fit on the device at once at the planned length (shared memory bounds the
/// CTAs per SM), each with at least one key tile. The kernel deals the tiles
/// out in runs of equal length (+-1), so the call lasts as long as its
/// longest run: of the split counts with the shortest longest run, the
/// fewest (16384 keys in 32-key tiles on 66 splits per KV head run 7 or 8
/// tiles; 64 splits run 8 each, with fewer partials to combine).
pub fn stream_splits(
    d: &Defines,
    t: &StreamTile,
    p: &crate::problem::AttnProblem,
    lim: &DeviceLimits,
) -> Result<usize, String> {
    let s = crate::defines::int_range(d, "SPLITS", 0, MAX_SPLITS as i64)? as usize;
    if s > 0 {
        return Ok(s);
    }
    let tiles = planned_key_tiles(p, t.bkv);
    let per_sm = attention::ctas_per_sm(t.smem_bytes(p.head_dim), t.threads(), lim);
    let ctas = p.n_q.div_ceil(t.bq / p.group()) * p.n_kv_heads;
    let want = (lim.sm_count as usize * per_sm)
        .div_ceil(ctas.max(1))
        .clamp(1, MAX_SPLITS);
    let longest = tiles.div_ceil(want);
    Ok(tiles.div_ceil(longest).clamp(1, MAX_SPLITS))
}

/// Key tiles a CTA of the first query rows visits at the planned length, as
/// attn_split.cuh's decode_split counts them: from the tile of the oldest
/// key a row sees (the oldest cached one, or the window's) to the tile of
/// the last query.
fn planned_key_tiles(p: &crate::problem::AttnProblem, bkv: usize) -> usize {
    let kv_len = p.kv_len().max(1);
    let cache_lo = kv_len.saturating_sub(p.capacity);
    let k_lo = if p.window > 0 {
        cache_lo.max((p.q_pos0 + 1).saturating_sub(p.window))
    } else {
        cache_lo
    };
    ((kv_len - 1) / bkv + 1).saturating_sub(k_lo / bkv).max(1)
}

/// The launch of the streaming kernel with `z` splits.
pub fn stream_geometry(
    t: &StreamTile,
    p: &crate::problem::AttnProblem,
    z: usize,
) -> LaunchGeometry {
    LaunchGeometry {
        kernel: "attn_decode".into(),
        grid: (
            p.n_q.div_ceil(t.bq / p.group()) as u32,
            p.n_kv_heads as u32,
            z as u32,
        ),
        block: (t.threads() as u32, 1, 1),
        dyn_smem: t.smem_bytes(p.head_dim) as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::problem::{AttnProblem, KvType};

    fn stream_defines(hd: i64, bq: i64, bkv: i64, kw: i64, wd: i64, stages: i64) -> Defines {
        let mut d = AttnDecode.default_defines(crate::quant::GgmlType::Q8_0);
        for (k, v) in [
            ("ALGO", 2i64),
            ("HEAD_DIM", hd),
            ("BQ", bq),
            ("BKV", bkv),
            ("KW", kw),
            ("WD", wd),
            ("STAGES", stages),
        ] {
            d.insert(k.into(), v.into());
        }
        d
    }

    /// E4B full-layer decode over 16K keys: hd 512, 2 KV heads of 4 query heads.
    fn e4b_full_decode() -> AttnProblem {
        AttnProblem {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 512,
            window: 0,
            q_pos0: 16383,
            n_q: 1,
            capacity: 16384,
            kv_type: KvType::F16,
        }
    }

    #[test]
    fn streaming_tiles_fit_and_fill_the_device() {
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = e4b_full_decode();
        let d = stream_defines(512, 16, 32, 2, 4, 3);
        let t = stream_tile(&d, &p, &lim).expect("fits");
        assert!(t.smem_bytes(512) <= lim.max_smem_per_block as usize);
        let z = stream_splits(&d, &t, &p, &lim).expect("splits");
        // One CTA per SM (the stages take most of shared memory): 66 splits
        // per KV head would run 7 or 8 of the 512 tiles, 64 run 8 each.
        assert_eq!(z, 64);
        // 32 rows at hd 512 would need 128 accumulators per thread.
        let d32 = stream_defines(512, 32, 32, 2, 4, 3);
        assert!(stream_tile(&d32, &p, &lim).is_err());
        // Over a 512-key window a split gets at least one tile.
        let w = AttnProblem {
            head_dim: 256,
            window: 512,
            capacity: 2559,
            ..p
        };
        let dw = stream_defines(256, 16, 32, 2, 2, 2);
        let tw = stream_tile(&dw, &w, &lim).expect("fits");
        assert!(stream_splits(&dw, &tw, &w, &lim).expect("splits") <= 512 / 32 + 2);
        // The contract is the tensor-core one.
        assert_eq!(AttnDecode.contract(&d), Contract::Approx);
    }

    #[test]
    fn splits_are_the_fewest_that_keep_the_longest_run() {
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = stream_defines(512, 16, 32, 2, 4, 3);
        for kv_len in [33, 700, 4096, 10_000, 16_384, 16_385, 40_000] {
            let p = AttnProblem {
                q_pos0: kv_len - 1,
                capacity: kv_len.max(16_384),
                ..e4b_full_decode()
            };
            let t = stream_tile(&d, &p, &lim).expect("fits");
            let z = stream_splits(&d, &t, &p, &lim).expect("splits");
            let tiles = (kv_len - 1) / 32 + 1;
            // At most one CTA per SM, every split holds a tile, and no
            // split count up to the device's runs shorter, or fewer splits
            // as short.
            let want = 132 / p.n_kv_heads;
            assert!(z >= 1 && z <= want.min(tiles), "{kv_len}: {z}");
            let longest = |n: usize| tiles.div_ceil(n);
            assert_eq!(longest(z), longest(want.min(tiles)), "{kv_len}: {z}");
            assert!(z == 1 || longest(z - 1) > longest(z), "{kv_len}: {z}");
        }
    }

    #[test]
    fn key_major_tiles_hold_a_whole_head_dim_per_warp() {
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = e4b_full_decode();
        let key_major = |bq, bkv, kw, wd, stages| {
            let mut d = stream_defines(512, bq, bkv, kw, wd, stages);
            d.insert("ALGO".into(), 3i64.into());
            d
        };
        // E4B: 8 rows, one warp per 16-key block holds all 512 dims of O^T
        // (128 accumulators); Q and three 32-key stages of K and V in
        // 1040-byte rows.
        let d = key_major(8, 32, 2, 1, 3);
        let t = stream_tile(&d, &p, &lim).expect("fits");
        assert!(t.key_major);
        assert_eq!(t.threads(), 64);
        assert_eq!(t.smem_bytes(512), 8 * 1040 + 3 * 2 * 32 * 1040);
        assert_eq!(stream_splits(&d, &t, &p, &lim).expect("splits"), 64);
        assert_eq!(AttnDecode.contract(&d), Contract::Approx);
        // 16 rows need two dim warps (256 accumulators in one).
        assert!(stream_tile(&key_major(16, 32, 2, 1, 3), &p, &lim).is_err());
        assert!(stream_tile(&key_major(16, 32, 2, 2, 3), &p, &lim).is_ok());
        // 8 rows cannot hold 12B's 16-head group.
        let p12 = AttnProblem {
            n_heads: 16,
            n_kv_heads: 1,
            ..p
        };
        assert!(stream_tile(&d, &p12, &lim).is_err());
        // ALGO 2's row tiles start at 16.
        let mut d2 = d.clone();
        d2.insert("ALGO".into(), 2i64.into());
        assert!(stream_tile(&d2, &p, &lim).is_err());
        // QSPLIT adds two buffers of partial S^T per key warp and dim warp.
        let mut dq = key_major(8, 32, 2, 2, 3);
        let t2 = stream_tile(&dq, &p, &lim).expect("fits");
        dq.insert("QSPLIT".into(), 1i64.into());
        let tq = stream_tile(&dq, &p, &lim).expect("fits");
        assert_eq!(tq.smem_bytes(512), t2.smem_bytes(512) + 2 * 2 * 2 * 128 * 4);
        // 208 KB of stages do not fit an sm_89 block.
        let lim89 = DeviceLimits::for_arch(Arch(89));
        assert!(stream_tile(&d, &p, &lim89).is_err());
        // Bulk copies add one mbarrier per stage, and need sm_90.
        let mut db = d.clone();
        db.insert("BULK".into(), 1i64.into());
        let tb = stream_tile(&db, &p, &lim).expect("fits");
        assert_eq!(tb.smem_bytes(512), t.smem_bytes(512) + 3 * 8);
        let small = key_major(8, 16, 1, 2, 2);
        let mut small_bulk = small.clone();
        small_bulk.insert("BULK".into(), 1i64.into());
        let lim80 = DeviceLimits::for_arch(Arch(80));
        assert!(stream_tile(&small, &p, &lim80).is_ok());
        assert!(stream_tile(&small_bulk, &p, &lim80).is_err());
        d2.insert("BULK".into(), 1i64.into());
        assert!(stream_tile(&d2, &p, &lim).is_err());
    }
}
