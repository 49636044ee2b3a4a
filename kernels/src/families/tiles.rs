//! Tile-define validation shared by the two prefill GEMM families.

use crate::defines::{get_int, int_in, int_range, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::problem::{check_wtype, MatmulProblem, WType};

pub(crate) struct Tiles {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps_m: usize,
    pub warps_n: usize,
    pub stages: usize,
}

/// PAD16 of common.cuh.
pub(crate) fn pad16(b: usize) -> usize {
    if (b / 16) % 2 == 0 {
        b + 16
    } else {
        b
    }
}

/// Reads and checks BM/BN/BK/WARPS_M/WARPS_N/STAGES/CP_ASYNC; `bn_unit` is
/// the feature granularity per warp (8 for mmq, 16 for gemm_dq's paired
/// ldmatrix).
pub(crate) fn read_tiles(d: &Defines, lim: &DeviceLimits, bn_unit: usize) -> Result<Tiles, String> {
    let bm = int_range(d, "BM", 16, 512)? as usize;
    let bn = int_range(d, "BN", 8, 512)? as usize;
    let bk = int_in(d, "BK", &[32, 64, 128])? as usize;
    let warps_m = int_range(d, "WARPS_M", 1, 32)? as usize;
    let warps_n = int_range(d, "WARPS_N", 1, 32)? as usize;
    let stages = int_range(d, "STAGES", 1, 4)? as usize;
    int_in(d, "CP_ASYNC", &[0, 1])?;
    let threads = 32 * warps_m * warps_n;
    if threads > lim.max_threads_per_block as usize {
        return Err(format!(
            "WARPS_M*WARPS_N = {} warps = {threads} threads > {}",
            warps_m * warps_n,
            lim.max_threads_per_block
        ));
    }
    if bm % (16 * warps_m) != 0 {
        return Err(format!(
            "BM={bm} is not a multiple of 16*WARPS_M = {}",
            16 * warps_m
        ));
    }
    if bn % (bn_unit * warps_n) != 0 {
        return Err(format!(
            "BN={bn} is not a multiple of {bn_unit}*WARPS_N = {}",
            bn_unit * warps_n
        ));
    }
    let acc = (bm / warps_m / 16) * (bn / warps_n / 8) * 4;
    if acc > 128 {
        return Err(format!(
            "{acc} fp32 accumulators per thread (> 128) would not fit in registers"
        ));
    }
    let _ = get_int(d, "STAGES")?;
    Ok(Tiles {
        bm,
        bn,
        bk,
        warps_m,
        warps_n,
        stages,
    })
}

/// Bytes of weight quants per row per BK step (the quant plane's share:
/// `WType::quant_bytes_per_block` per 32 elements).
pub(crate) fn bkw(wt: WType, bk: usize) -> usize {
    bk / 32 * wt.quant_bytes_per_block()
}

/// 4-byte scale or side words per 32 elements a tile stages beside the
/// quants: the f32 scale (Q8_0, Q4_0), the k-quants' GEMM side words
/// (`quant::repack::gemm_side_words`), none for F16/BF16.
pub(crate) fn scale_words(wt: WType) -> usize {
    match wt {
        WType::Q8_0 | WType::Q4_0 => 1,
        WType::F16 | WType::Bf16 => 0,
        _ => crate::quant::repack::gemm_side_words(wt.ggml()),
    }
}

/// The weight type of a gemm_dq / gemm_wgmma shape: every matmul type, the
/// k-quants on their planes, F16/BF16 as stored with `k` a multiple of 32
/// (the activation pre-pass permutes k in groups of 16 and the tiles step
/// in 32-element groups).
pub(crate) fn gemm_wtype(d: &Defines, mp: &MatmulProblem) -> Result<WType, String> {
    let wt = check_wtype(d, mp)?;
    if mp.k % 32 != 0 {
        return Err(format!(
            "k={} is not a multiple of 32 (the prefill GEMMs step k in 32-element groups)",
            mp.k
        ));
    }
    Ok(wt)
}

pub(crate) fn geometry(
    kernel: &str,
    t: &Tiles,
    mp: &MatmulProblem,
    smem: usize,
    lim: &DeviceLimits,
) -> Result<LaunchGeometry, String> {
    if smem > lim.max_smem_per_block as usize {
        return Err(format!(
            "needs {smem} bytes of shared memory, the {} limit is {}",
            lim.arch, lim.max_smem_per_block
        ));
    }
    let gy = mp.n.div_ceil(t.bn);
    if gy > 65535 {
        return Err(format!("{gy} feature tiles exceed grid.y's 65535"));
    }
    Ok(LaunchGeometry {
        kernel: kernel.to_string(),
        grid: (mp.m.div_ceil(t.bm) as u32, gy as u32, 1),
        block: ((32 * t.warps_m * t.warps_n) as u32, 1, 1),
        dyn_smem: smem as u32,
    })
}
