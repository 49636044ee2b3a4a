//! `moe_gemm`: the chosen experts' gated FFN for a prefill chunk (up to
//! 4096 tokens) as grouped tensor-core GEMMs, in four stages selected by
//! `STAGE` (GROUP, GATE_UP, DOWN, COMBINE), each checked on its own inputs.
//! See kernels/cuda/moe_gemm.cu and `bind::moe`.
//!
//! The check routes every token to `used` distinct experts drawn with a
//! skew toward the low experts (so some experts hold several tiles of
//! pairs and others none), gives the last expert exactly one pair, and
//! marks some pairs skipped (ids -1, E, -7 and i32::MAX). Only the chosen
//! experts carry their own random weights; every other expert holds one
//! shared decoy (`moe_gemv::expert_tensor`). The GEMM stages read a
//! grouping whose order inside each expert is shuffled, so a row's result
//! must not depend on its position in a tile; the rows of skipped pairs in
//! their activations are NaN (never to be read), and their output rows must
//! keep the poison (never written).
//!
//! The parts: `reference` (the check's routing, inputs, GEMM references and
//! COMBINE replay), `workloads` (one per stage); this file holds the
//! family: stages, tiles, validation, launch geometry, tolerances.

use super::gemm_dq::rounded_operands_tolerance;
use super::gemv::fp_rms_bound;
use super::moe_gemv::distinct_experts;
use super::{memo, rng_for};
use crate::bind::moe::{expert_binding, moe_gemm_max_tiles};
use crate::defines::{defines, get_str, int_in, int_range, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::oracle::{combine_experts, group_by_expert};
use crate::problem::{check_wtype, moe_of, MatmulProblem, MoeProblem, Problem, ProblemKind, WType};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::{WeightSet, Workload};
use rand::seq::SliceRandom;

mod reference;
#[cfg(test)]
mod tests;
mod workloads;

use reference::{combine_replay, gemm_inputs, gemm_reference, valid_id};
use workloads::{CombineWorkload, GemmWorkload, GroupOut, GroupWorkload};

pub struct MoeGemm;

/// Most tokens of a chunk, experts, and experts per token.
pub const MAX_TOKENS: usize = 4096;
pub const MAX_EXPERTS: usize = 256;
pub const MAX_USED: usize = 32;
/// GROUP's block and COMBINE's block (outputs per COMBINE block: 4 each).
pub const GROUP_THREADS: u32 = 1024;
pub const COMBINE_THREADS: u32 = 256;

/// Which stage of the expert FFN a variant computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Pairs sorted by expert, counts, offsets and the tile table.
    Group,
    /// `h = gelu(gate x) * (up x)` per valid pair.
    GateUp,
    /// `yp = down h` per valid pair.
    Down,
    /// `y = sum_j w_j yp_j` per token.
    Combine,
}

impl Stage {
    pub fn of(d: &Defines) -> Result<Stage, String> {
        match get_str(d, "STAGE")?.as_str() {
            "GROUP" => Ok(Stage::Group),
            "GATE_UP" => Ok(Stage::GateUp),
            "DOWN" => Ok(Stage::Down),
            "COMBINE" => Ok(Stage::Combine),
            s => Err(format!("STAGE={s} is not GROUP, GATE_UP, DOWN or COMBINE")),
        }
    }
    fn is_gemm(self) -> bool {
        matches!(self, Stage::GateUp | Stage::Down)
    }
    /// A GEMM stage's expert tensor as one matrix: (rows per expert, row
    /// length) — moe_gemv's.
    fn matrix(self, p: &MoeProblem) -> (usize, usize) {
        match self {
            Stage::Down => (p.d_model, p.ffn),
            _ => (2 * p.ffn, p.d_model),
        }
    }
}

/// The tile defines of a GEMM stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTiles {
    pub bm: usize,
    pub bn: usize,
    pub bk: usize,
    pub warps_m: usize,
    pub warps_n: usize,
    pub stages: usize,
    /// SMEM_DQ: 0 operands converted in registers per warp; 1 the weight
    /// tile dequantized once per stage into shared memory (ldmatrix); 2 the
    /// activation tile rounded there too; 3 as 2, double-buffered.
    pub smem_dq: usize,
}

impl GemmTiles {
    pub fn threads(&self) -> usize {
        32 * self.warps_m * self.warps_n
    }
    /// Dynamic shared memory (the header's formula).
    pub fn smem_bytes(&self, wt: WType) -> usize {
        let a = self.bm * (4 * self.bk + 64);
        let bkw = match wt {
            WType::Q8_0 => self.bk,
            WType::F16 | WType::Bf16 => 2 * self.bk,
            _ => self.bk / 2,
        };
        let b = self.bn * super::tiles::pad16(bkw);
        let scb = match wt {
            WType::Q8_0 | WType::Q4_0 => 4 * (self.bk / 64).max(1),
            WType::F16 | WType::Bf16 => 0,
            _ => crate::quant::repack::gemv_side_bytes(wt.ggml()),
        };
        let s = (self.bn * scb).div_ceil(16) * 16;
        // The converted DQ_TYPE tiles after the ring (SMEM_DQ >= 1).
        let sh = super::tiles::pad16(2 * self.bk);
        let conv = match self.smem_dq {
            0 => 0,
            1 => self.bn * sh,
            2 => (self.bm + self.bn) * sh,
            _ => 2 * (self.bm + self.bn) * sh,
        };
        self.stages * (a + b + s) + conv
    }
}

/// SMEM_DQ: where the GEMM stages convert their operands to DQ_TYPE.
fn read_smem_dq(d: &Defines) -> Result<usize, String> {
    int_in(d, "SMEM_DQ", &[0, 1, 2, 3])
        .map(|v| v as usize)
        .map_err(|e| {
            format!(
                "{e}: 0 (registers), 1 (weight tile in shared memory), 2 (both operand tiles) or 3 (both, double-buffered)"
            )
        })
}

/// Reads and checks the tile defines (a GEMM stage's), with reasons.
pub fn read_tiles(d: &Defines, stage: Stage) -> Result<GemmTiles, String> {
    let t = GemmTiles {
        bm: int_range(d, "BM", 16, 256)? as usize,
        bn: int_range(d, "BN", 16, 256)? as usize,
        bk: int_in(d, "BK", &[32, 64, 128])? as usize,
        warps_m: int_in(d, "WARPS_M", &[1, 2, 4, 8])? as usize,
        warps_n: int_in(d, "WARPS_N", &[1, 2, 4, 8])? as usize,
        stages: int_range(d, "STAGES", 2, 4)? as usize,
        smem_dq: read_smem_dq(d)?,
    };
    if t.threads() > 1024 {
        return Err(format!(
            "WARPS_M*WARPS_N = {} warps exceed 1024 threads",
            t.warps_m * t.warps_n
        ));
    }
    if t.bm % (16 * t.warps_m) != 0 {
        return Err(format!(
            "BM={} is not a multiple of 16*WARPS_M = {}",
            t.bm,
            16 * t.warps_m
        ));
    }
    // GATE_UP: each warp's columns are a gate half and an up half of
    // whole 8-column MMA tiles.
    let unit = if stage == Stage::GateUp { 16 } else { 8 };
    if t.bn % (unit * t.warps_n) != 0 {
        return Err(format!(
            "BN={} is not a multiple of {unit}*WARPS_N = {}{}",
            t.bn,
            unit * t.warps_n,
            if unit == 16 {
                " (GATE_UP: a gate and an up half of 8-column tiles per warp)"
            } else {
                ""
            }
        ));
    }
    let acc = (t.bm / t.warps_m / 16) * (t.bn / t.warps_n / 8) * 4;
    if acc > 64 {
        return Err(format!(
            "{acc} fp32 accumulators per thread (> 64) would not fit in registers beside the operand conversion"
        ));
    }
    if t.bk == 128 && acc > 32 {
        return Err(format!(
            "BK=128 with {acc} accumulators per thread (> 32) spills (the unrolled k16 steps' operands)"
        ));
    }
    Ok(t)
}

/// Q5_K / Q6_K's decode beside 64-row warp tiles spills under the
/// 255-register limit; Q6_K's beside 64 accumulators under the 128 of a
/// block above 256 threads.
fn check_ktype_tiles(t: &GemmTiles, wt: WType) -> Result<(), String> {
    if matches!(wt, WType::Q5K | WType::Q6K) && t.bm / t.warps_m >= 64 {
        return Err(format!(
            "{} with 64-row warp tiles (BM / WARPS_M = {}) spills: use WARPS_M >= BM / 32",
            wt.define(),
            t.bm / t.warps_m
        ));
    }
    // Above 256 threads a block gets at most 128 registers per thread.
    let acc = (t.bm / t.warps_m / 16) * (t.bn / t.warps_n / 8) * 4;
    if wt == WType::Q6K && t.threads() > 256 && acc >= 64 {
        return Err(format!(
            "Q6_K with {} threads and {acc} accumulators per thread spills under the 128-register cap: use <= 256 threads or smaller warp tiles",
            t.threads()
        ));
    }
    Ok(())
}

/// The expert tensor's weight type and size rules for a GEMM stage.
fn check_weights(d: &Defines, p: &MoeProblem, stage: Stage) -> Result<WType, String> {
    let (rows, k) = stage.matrix(p);
    let what = match stage {
        Stage::Down => "down (k = ffn)",
        _ => "gate_up (k = d_model)",
    };
    let mp = MatmulProblem {
        m: p.tokens,
        n: p.experts * rows,
        k,
        wtype: p.wtype,
    };
    let wt = check_wtype(d, &mp).map_err(|e| format!("{what}: {e}"))?;
    int_in(d, "LAYOUT", &[1])
        .map_err(|e| format!("{e}: moe_gemm reads moe_gemv's planes (LAYOUT=1) only"))?;
    let unit = match wt {
        WType::Q8_0 | WType::Q4_0 => 64,
        _ if wt.is_kquant() => 256,
        _ => 32,
    };
    if k % unit != 0 {
        return Err(format!(
            "{what}: k={k} is not a multiple of {unit} ({} rows are staged in {unit}-element units{})",
            wt.define(),
            if unit == 64 {
                ": two f16 scales per 4-byte copy"
            } else {
                ""
            }
        ));
    }
    Ok(wt)
}

/// The common shape rules of every stage.
fn check_problem(p: &MoeProblem) -> Result<(), String> {
    if p.tokens > MAX_TOKENS {
        return Err(format!(
            "moe_gemm handles up to {MAX_TOKENS} tokens per chunk, not m={}",
            p.tokens
        ));
    }
    if p.experts > MAX_EXPERTS {
        return Err(format!(
            "{} experts: the grouping holds at most {MAX_EXPERTS}",
            p.experts
        ));
    }
    if p.used > MAX_USED {
        return Err(format!(
            "used = {}: at most {MAX_USED} experts per token",
            p.used
        ));
    }
    if p.d_model % 32 != 0 || p.ffn % 32 != 0 {
        return Err(format!(
            "d_model={} and ffn={} must be multiples of 32",
            p.d_model, p.ffn
        ));
    }
    Ok(())
}

/// Rounds to the MMA operand type and back (the replay's operand rule).
fn round_op(v: f32, bf16: bool) -> f32 {
    if bf16 {
        bf16_to_f32(f32_to_bf16(v))
    } else {
        f16_to_f32(f32_to_f16(v))
    }
}

fn is_bf16(d: &Defines) -> Result<bool, String> {
    match get_str(d, "DQ_TYPE")?.as_str() {
        "F16" => Ok(false),
        "BF16" => Ok(true),
        o => Err(format!("DQ_TYPE={o}: must be F16 or BF16")),
    }
}

impl Family for MoeGemm {
    fn name(&self) -> &'static str {
        "moe_gemm"
    }
    fn entry(&self) -> &'static str {
        "moe_gemm"
    }
    fn source_file(&self) -> &'static str {
        "moe_gemm.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Moe
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("LAYOUT", 1i64),
            ("BM", 64),
            ("BN", 128),
            ("BK", 64),
            ("WARPS_M", 2),
            ("WARPS_N", 4),
            ("STAGES", 3),
            ("SMEM_DQ", 0),
        ]);
        d.insert("STAGE".into(), DefineValue::Str("GATE_UP".into()));
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d.insert("DQ_TYPE".into(), DefineValue::Str("F16".into()));
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match Stage::of(d) {
            Ok(Stage::Group) | Ok(Stage::Combine) => Contract::Bitexact,
            _ => Contract::Approx,
        }
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        let stage = Stage::of(d).unwrap_or(Stage::GateUp);
        if !stage.is_gemm() {
            return Tolerance::bitexact();
        }
        let k = moe_of(p).map(|m| stage.matrix(m).1).unwrap_or(32);
        let mut t = rounded_operands_tolerance(is_bf16(d).unwrap_or(true), k);
        if stage == Stage::GateUp {
            // The product of two rounded dots: both errors reach h (the
            // GELU's slope is at most ~1.13), and the replay differs by
            // the f32 tanh as well as by the summation order.
            t.rms_rel *= 2.0;
            t.replay_rms_rel = 4.0 * fp_rms_bound(k);
        }
        t
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = moe_of(p)?;
        let stage = Stage::of(d)?;
        check_problem(mp)?;
        is_bf16(d)?;
        let pairs = mp.tokens * mp.used;
        match stage {
            Stage::Group => {
                // The table GROUP writes must fit the GEMMs' grid.y.
                let t = read_tiles(d, Stage::Down)?;
                let n = moe_gemm_max_tiles(pairs, mp.experts, t.bm);
                if n > 65535 {
                    return Err(format!("{n} tiles exceed grid.y's 65535"));
                }
                Ok(LaunchGeometry {
                    kernel: "moe_gemm_group".into(),
                    grid: (1, 1, 1),
                    block: (GROUP_THREADS, 1, 1),
                    dyn_smem: 0,
                })
            }
            Stage::Combine => Ok(LaunchGeometry {
                kernel: "moe_gemm_combine".into(),
                grid: (
                    mp.d_model.div_ceil(4 * COMBINE_THREADS as usize) as u32,
                    mp.tokens as u32,
                    1,
                ),
                block: (COMBINE_THREADS, 1, 1),
                dyn_smem: 0,
            }),
            Stage::GateUp | Stage::Down => {
                let wt = check_weights(d, mp, stage)?;
                let t = read_tiles(d, stage)?;
                check_ktype_tiles(&t, wt)?;
                if t.threads() > lim.max_threads_per_block as usize {
                    return Err(format!(
                        "{} threads exceed the device's {}",
                        t.threads(),
                        lim.max_threads_per_block
                    ));
                }
                let smem = t.smem_bytes(wt);
                if smem > lim.max_smem_per_block as usize {
                    return Err(format!(
                        "needs {smem} bytes of shared memory, the {} limit is {}",
                        lim.arch, lim.max_smem_per_block
                    ));
                }
                let tiles = moe_gemm_max_tiles(pairs, mp.experts, t.bm);
                if tiles > 65535 {
                    return Err(format!("{tiles} tiles exceed grid.y's 65535"));
                }
                let (gx, kernel) = match stage {
                    Stage::GateUp => (mp.ffn.div_ceil(t.bn / 2), "moe_gemm_gate_up"),
                    _ => (mp.d_model.div_ceil(t.bn), "moe_gemm_down"),
                };
                Ok(LaunchGeometry {
                    kernel: kernel.into(),
                    grid: (gx as u32, tiles as u32, 1),
                    block: (t.threads() as u32, 1, 1),
                    dyn_smem: smem as u32,
                })
            }
        }
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let mp = *moe_of(p).map_err(GpuError::Rejected)?;
        let stage = Stage::of(d).map_err(GpuError::Rejected)?;
        let bm = read_tiles(d, Stage::Down).map_err(GpuError::Rejected)?.bm;
        let wt = if stage.is_gemm() {
            Some(check_weights(d, &mp, stage).map_err(GpuError::Rejected)?)
        } else {
            None
        };
        let key = format!("moe_gemm inputs {mp:?} {stage:?} {seed}");
        let inp = memo::get_or_try(key, || gemm_inputs(&mp, stage, wt, seed))?;
        let ids = gpu.upload(&inp.ids)?;
        let route_w = gpu.upload(&inp.weights)?;
        let act = gpu.upload(&inp.act)?;
        let pairs = mp.tokens * mp.used;
        let grouping = group_by_expert(&inp.ids, mp.experts, bm);
        let valid: Vec<usize> = (0..pairs)
            .filter(|&q| valid_id(inp.ids[q], mp.experts))
            .collect();
        match stage {
            Stage::Group => {
                let out = GroupOut {
                    counts: gpu.alloc(4 * mp.experts)?,
                    offsets: gpu.alloc(4 * (mp.experts + 1))?,
                    sorted: gpu.alloc(4 * pairs)?,
                    tiles: gpu.alloc(8 * grouping.tiles.len())?,
                };
                Ok(Box::new(GroupWorkload {
                    ids,
                    out,
                    want: grouping,
                    p: mp,
                    bm,
                    geo: geo.clone(),
                }))
            }
            Stage::Combine => {
                let y = gpu.alloc(4 * mp.tokens * mp.d_model)?;
                let replay = combine_replay(&inp.act, &inp.ids, &inp.weights, &mp);
                let reference = combine_experts(
                    &inp.act,
                    &inp.ids,
                    &inp.weights,
                    mp.tokens,
                    mp.d_model,
                    mp.experts,
                    mp.used,
                );
                Ok(Box::new(CombineWorkload {
                    yp: act,
                    ids,
                    route_w,
                    y,
                    replay,
                    reference,
                    p: mp,
                    geo: geo.clone(),
                }))
            }
            Stage::GateUp | Stage::Down => {
                let wt = wt.ok_or_else(|| GpuError::Other("no weight type".into()))?;
                let bf16 = is_bf16(d).map_err(GpuError::Rejected)?;
                let binding = expert_binding(d).map_err(GpuError::Rejected)?;
                let tensor = inp
                    .tensor
                    .as_ref()
                    .ok_or_else(|| GpuError::Other("no expert tensor".into()))?;
                let planes = tensor.all.upload(gpu, wt, binding.layout)?;
                // The order inside each expert's group is shuffled: the
                // GEMM must not depend on a row's place in its tile.
                let mut rng = rng_for("moe_gemm shuffle", &[pairs, bm], seed);
                let mut sorted = grouping.sorted.clone();
                for e in 0..mp.experts {
                    let (a, b) = (
                        grouping.offsets[e] as usize,
                        grouping.offsets[e + 1] as usize,
                    );
                    sorted[a..b].shuffle(&mut rng);
                }
                let tiles: Vec<i32> = grouping.tiles.iter().flat_map(|t| [t[0], t[1]]).collect();
                let sorted_dev = gpu.upload(&sorted)?;
                let tiles_dev = gpu.upload(&tiles)?;
                let offsets_dev = gpu.upload(&grouping.offsets)?;
                let (rows, k) = stage.matrix(&mp);
                let n_out = match stage {
                    Stage::GateUp => mp.ffn,
                    _ => mp.d_model,
                };
                let out = gpu.alloc(4 * pairs * n_out)?;
                let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
                let chosen = distinct_experts(&inp.ids).len();
                let per_expert = weight_bytes / mp.experts as u64;
                let bytes = per_expert * chosen as u64 + (valid.len() * (k + n_out) * 4) as u64;
                let ops = 2 * (valid.len() * rows * k) as u64;
                let key = format!("moe_gemm ref {mp:?} {stage:?} {seed}");
                let inp2 = inp;
                let valid2 = valid.clone();
                let reference: super::RefFn = Box::new(move || {
                    let r = memo::get(format!("{key} f64"), || {
                        gemm_reference(&mp, stage, &inp2, &valid2, None)
                    });
                    let rp = memo::get(format!("{key} replay bf16={bf16}"), || {
                        gemm_reference(&mp, stage, &inp2, &valid2, Some(bf16))
                    });
                    ((*r).clone(), Some((*rp).clone()))
                });
                Ok(Box::new(GemmWorkload {
                    weights: WeightSet::new(planes),
                    act,
                    sorted: sorted_dev,
                    tiles: tiles_dev,
                    offsets: offsets_dev,
                    out,
                    valid,
                    n_out,
                    stage,
                    p: mp,
                    geo: geo.clone(),
                    reference,
                    bytes,
                    ops,
                }))
            }
        }
    }
}
