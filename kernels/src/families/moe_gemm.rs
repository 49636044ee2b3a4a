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

use super::gemm_dq::rounded_operands_tolerance;
use super::gemv::fp_rms_bound;
use super::moe_gemv::{distinct_experts, expert_tensor, ExpertTensor};
use super::{gelu_tanh_f64, memo, random_matrix, rng_for};
use crate::bind::moe::{
    expert_binding, moe_gemm_max_tiles, ExpertWeights, MoeCombineArgs, MoeGemmDownArgs,
    MoeGemmGateUpArgs, MoeGroupArgs,
};
use crate::bind::NULL;
use crate::defines::{defines, get_str, int_in, int_range, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::kernel_family::Family;
use crate::oracle::{combine_experts, group_by_expert, MoeGrouping};
use crate::problem::{check_wtype, moe_of, MatmulProblem, MoeProblem, Problem, ProblemKind, WType};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::verdict::{compare, CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, WeightSet, Workload};
use rand::seq::SliceRandom;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

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

fn valid_id(e: i32, experts: usize) -> bool {
    e >= 0 && (e as usize) < experts
}

/// The ids the check marks skipped, in turn.
const INVALID_IDS: [i32; 4] = [-1, i32::MAX, -7, 0];

/// Each token's `used` distinct experts, drawn with a skew toward the low
/// experts (a quartic pick from the remaining pool), the last expert
/// given to pair 0 alone, about one pair in eleven skipped (ids -1,
/// i32::MAX, -7 or E), and positive weights summing to one per token over
/// all its slots, `[tokens][used]`.
pub(crate) fn gemm_routing(rng: &mut ChaCha8Rng, p: &MoeProblem) -> (Vec<i32>, Vec<f32>) {
    let single = p.experts as i32 - 1;
    // The single-pair expert is kept out of the pools when the others
    // still offer `used` distinct experts.
    let reserve = p.experts > p.used;
    let mut ids = Vec::with_capacity(p.tokens * p.used);
    let mut weights = Vec::with_capacity(p.tokens * p.used);
    for t in 0..p.tokens {
        let mut pool: Vec<i32> = (0..p.experts as i32)
            .filter(|&e| !reserve || e != single)
            .collect();
        for j in 0..p.used {
            let u: f64 = rng.random_range(0.0..1.0);
            let last = pool.len() - 1;
            let pick = j + (u.powi(4) * (pool.len() - j) as f64) as usize;
            pool.swap(j, pick.min(last));
        }
        let mut row = pool[..p.used].to_vec();
        if t == 0 && reserve {
            row[0] = single;
        }
        for (j, id) in row.iter_mut().enumerate() {
            let q = t * p.used + j;
            if q > 0 && (t * 7 + j * 3) % 11 == 5 {
                let bad = INVALID_IDS[q % 4];
                *id = if bad == 0 { p.experts as i32 } else { bad };
            }
        }
        ids.extend_from_slice(&row);
        let w: Vec<f32> = (0..p.used)
            .map(|_| rng.random_range(0.05f32..1.0))
            .collect();
        let s: f32 = w.iter().sum();
        weights.extend(w.iter().map(|v| v / s));
    }
    (ids, weights)
}

/// A check's inputs for one (problem, stage, seed).
pub(crate) struct GemmInputs {
    ids: Vec<i32>,
    weights: Vec<f32>,
    /// GATE_UP x `[tokens][d]`; DOWN h `[pairs][ffn]`; COMBINE yp
    /// `[pairs][d]`; GROUP empty. Rows of skipped pairs are NaN.
    act: Vec<f32>,
    tensor: Option<ExpertTensor>,
}

fn gemm_inputs(
    p: &MoeProblem,
    stage: Stage,
    wt: Option<WType>,
    seed: u64,
) -> Result<GemmInputs, GpuError> {
    let dims = [
        p.tokens,
        p.d_model,
        p.ffn,
        p.experts,
        p.used,
        wt.map_or(99, |w| w as usize),
        stage as usize,
    ];
    let mut rng = rng_for("moe_gemm", &dims, seed);
    let (ids, weights) = gemm_routing(&mut rng, p);
    let pairs = p.tokens * p.used;
    let nan_skipped = |mut v: Vec<f32>, width: usize| -> Vec<f32> {
        for (q, &e) in ids.iter().enumerate() {
            if !valid_id(e, p.experts) {
                v[q * width..(q + 1) * width].fill(f32::NAN);
            }
        }
        v
    };
    let act = match stage {
        Stage::Group => Vec::new(),
        Stage::GateUp => random_matrix(&mut rng, p.tokens, p.d_model),
        Stage::Down => nan_skipped(random_matrix(&mut rng, pairs, p.ffn), p.ffn),
        Stage::Combine => nan_skipped(random_matrix(&mut rng, pairs, p.d_model), p.d_model),
    };
    let tensor = match wt {
        Some(wt) if stage.is_gemm() => {
            let (rows, k) = stage.matrix(p);
            let chosen = distinct_experts(
                &ids.iter()
                    .map(|&e| if valid_id(e, p.experts) { e } else { -1 })
                    .collect::<Vec<_>>(),
            );
            Some(expert_tensor(
                "moe_gemm", &dims, wt, p.experts, rows, k, &chosen, seed,
            )?)
        }
        _ => None,
    };
    Ok(GemmInputs {
        ids,
        weights,
        act,
        tensor,
    })
}

/// A GEMM stage's output rows of the valid pairs `valid`, in that order:
/// the f64 oracle on the exact weights (`round` None) or the replay with
/// both operands rounded to the operand type (`Some(bf16)`), f64 sums.
fn gemm_reference(
    p: &MoeProblem,
    stage: Stage,
    inp: &GemmInputs,
    valid: &[usize],
    round: Option<bool>,
) -> Vec<f64> {
    use rayon::prelude::*;
    let (d, ff, k) = (p.d_model, p.ffn, p.used);
    let r = |v: f32| -> f64 {
        match round {
            Some(b) => round_op(v, b) as f64,
            None => v as f64,
        }
    };
    let dot = |w: &[f32], x: &[f64]| -> f64 { w.iter().zip(x).map(|(&a, &b)| r(a) * b).sum() };
    let Some(tensor) = inp.tensor.as_ref() else {
        return Vec::new();
    };
    valid
        .par_iter()
        .flat_map_iter(|&q| {
            let e = inp.ids[q] as usize;
            let w = &tensor.deq[&e];
            let out: Vec<f64> = match stage {
                Stage::GateUp => {
                    let t = q / k;
                    let x: Vec<f64> = inp.act[t * d..(t + 1) * d].iter().map(|&v| r(v)).collect();
                    (0..ff)
                        .map(|o| {
                            let g = dot(&w[o * d..(o + 1) * d], &x);
                            let u = dot(&w[(ff + o) * d..(ff + o + 1) * d], &x);
                            gelu_tanh_f64(g) * u
                        })
                        .collect()
                }
                _ => {
                    let h: Vec<f64> = inp.act[q * ff..(q + 1) * ff]
                        .iter()
                        .map(|&v| r(v))
                        .collect();
                    (0..d).map(|o| dot(&w[o * ff..(o + 1) * ff], &h)).collect()
                }
            };
            out
        })
        .collect()
}

/// COMBINE's defined arithmetic replayed: per output, `acc = fma(w, v,
/// acc)` from 0 over the valid slots in slot order, in f32.
fn combine_replay(yp: &[f32], ids: &[i32], weights: &[f32], p: &MoeProblem) -> Vec<f32> {
    let (d, k) = (p.d_model, p.used);
    let mut y = vec![0f32; p.tokens * d];
    for t in 0..p.tokens {
        for j in 0..k {
            let q = t * k + j;
            if !valid_id(ids[q], p.experts) {
                continue;
            }
            let w = weights[q];
            for (o, &v) in y[t * d..(t + 1) * d]
                .iter_mut()
                .zip(&yp[q * d..(q + 1) * d])
            {
                *o = w.mul_add(v, *o);
            }
        }
    }
    y
}

struct GroupOut {
    counts: DeviceBuffer,
    offsets: DeviceBuffer,
    sorted: DeviceBuffer,
    tiles: DeviceBuffer,
}

struct GroupWorkload {
    ids: DeviceBuffer,
    out: GroupOut,
    want: MoeGrouping,
    p: MoeProblem,
    bm: usize,
    geo: LaunchGeometry,
}

/// The kernel's GROUP outputs with every expert's pairs in ascending order
/// (the order inside a group is free): counts, offsets, sorted (the valid
/// entries), tiles flattened — what the check compares and the
/// determinism check sees.
fn canonical_group(
    counts: Vec<i32>,
    offsets: Vec<i32>,
    mut sorted: Vec<i32>,
    tiles: Vec<i32>,
    want: &MoeGrouping,
) -> Vec<i32> {
    let n_valid = want.sorted.len();
    sorted.truncate(n_valid);
    let e = want.counts.len();
    for x in 0..e {
        // The expected segment bounds: a kernel with wrong offsets fails
        // on them, and its segments are compared as they stand.
        let (a, b) = (want.offsets[x] as usize, want.offsets[x + 1] as usize);
        if a <= b && b <= sorted.len() {
            sorted[a..b].sort_unstable();
        }
    }
    let mut v = counts;
    v.extend(offsets);
    v.extend(sorted);
    v.extend(tiles);
    v
}

impl GroupWorkload {
    fn kargs(&self) -> Vec<KArg> {
        MoeGroupArgs {
            ids: self.ids.ptr(),
            counts: self.out.counts.ptr(),
            offsets: self.out.offsets.ptr(),
            sorted: self.out.sorted.ptr(),
            tiles: self.out.tiles.ptr(),
            n_tokens: self.p.tokens,
            n_experts: self.p.experts,
            n_used: self.p.used,
            bm: self.bm,
        }
        .kargs()
    }
    fn canonical(&self, gpu: &Gpu) -> Result<Vec<i32>, GpuError> {
        Ok(canonical_group(
            gpu.download(&self.out.counts)?,
            gpu.download(&self.out.offsets)?,
            gpu.download(&self.out.sorted)?,
            gpu.download(&self.out.tiles)?,
            &self.want,
        ))
    }
}

fn want_group(w: &MoeGrouping) -> Vec<i32> {
    let mut v = w.counts.clone();
    v.extend(&w.offsets);
    v.extend(&w.sorted);
    v.extend(w.tiles.iter().flat_map(|t| [t[0], t[1]]));
    v
}

/// Compares GROUP's canonical outputs with the expected ones: the report
/// of a bit-exact comparison, its detail naming the first differing part.
fn group_report(got: &[i32], want: &MoeGrouping) -> CheckReport {
    let w = want_group(want);
    let e = want.counts.len();
    let parts = [
        ("counts", 0, e),
        ("offsets", e, 2 * e + 1),
        ("sorted", 2 * e + 1, 2 * e + 1 + want.sorted.len()),
        ("tiles", 2 * e + 1 + want.sorted.len(), w.len()),
    ];
    let bad = got.iter().zip(&w).filter(|(a, b)| a != b).count() + w.len().abs_diff(got.len());
    let unwritten = got.iter().filter(|&&v| v as u32 == POISON_BITS).count();
    let mut rep = CheckReport::exact(w.len(), bad, unwritten);
    let mut why = Vec::new();
    for (name, a, b) in parts {
        let g = got.get(a..b.min(got.len())).unwrap_or(&[]);
        if let Some(i) = g.iter().zip(&w[a..b]).position(|(x, y)| x != y) {
            why.push(format!("{name}[{i}] = {} (want {})", g[i], w[a + i]));
        }
    }
    rep.detail = if why.is_empty() && rep.passed {
        format!(
            "grouping exact: {} valid pairs of {} in {} tiles (BM rows)",
            want.sorted.len(),
            want.counts.len(),
            want.tiles.iter().filter(|t| t[0] >= 0).count()
        )
    } else {
        format!("{}; {}", rep.detail, why.join(", "))
    };
    rep
}

impl Workload for GroupWorkload {
    fn weight_bytes(&self) -> u64 {
        0
    }
    fn set_weight_copies(&mut self, _gpu: &Gpu, _n: usize) -> Result<(), GpuError> {
        Ok(())
    }
    fn weight_copies(&self) -> usize {
        1
    }
    fn launch(&self, gpu: &Gpu, m: &Module, _copy: usize) -> Result<(), GpuError> {
        gpu.launch(m, &self.geo, &self.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(
            gpu,
            &[
                &self.out.counts,
                &self.out.offsets,
                &self.out.sorted,
                &self.out.tiles,
            ],
        )
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        _contract: Contract,
        _tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        Ok(group_report(&self.canonical(gpu)?, &self.want))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        Ok(self.canonical(gpu)?.iter().map(|&v| v as u32).collect())
    }
    fn bytes_per_call(&self) -> u64 {
        let pairs = (self.p.tokens * self.p.used) as u64;
        // ids read twice, sorted written, the small tables.
        12 * pairs + (8 * self.want.tiles.len() + 8 * self.p.experts) as u64
    }
    fn ops_per_call(&self) -> u64 {
        (self.p.tokens * self.p.used) as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::IntOp
    }
}

struct CombineWorkload {
    yp: DeviceBuffer,
    ids: DeviceBuffer,
    route_w: DeviceBuffer,
    y: DeviceBuffer,
    replay: Vec<f32>,
    reference: Vec<f64>,
    p: MoeProblem,
    geo: LaunchGeometry,
}

impl CombineWorkload {
    fn kargs(&self) -> Vec<KArg> {
        MoeCombineArgs {
            yp: self.yp.ptr(),
            ids: self.ids.ptr(),
            weights: self.route_w.ptr(),
            y: self.y.ptr(),
            n_tokens: self.p.tokens,
            d: self.p.d_model,
            n_experts: self.p.experts,
            n_used: self.p.used,
        }
        .kargs()
    }
}

impl Workload for CombineWorkload {
    fn weight_bytes(&self) -> u64 {
        0
    }
    fn set_weight_copies(&mut self, _gpu: &Gpu, _n: usize) -> Result<(), GpuError> {
        Ok(())
    }
    fn weight_copies(&self) -> usize {
        1
    }
    fn launch(&self, gpu: &Gpu, m: &Module, _copy: usize) -> Result<(), GpuError> {
        gpu.launch(m, &self.geo, &self.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.y])
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let out: Vec<f32> = gpu.download(&self.y)?;
        let replay: Vec<f64> = self.replay.iter().map(|&v| v as f64).collect();
        let mut rep = compare(&out, &self.reference, Some(&replay), contract, tol);
        // The replay is the defined arithmetic; the f64 oracle bounds it.
        let fp = compare(
            &self.replay,
            &self.reference,
            None,
            Contract::Fp,
            &Tolerance::fp(fp_rms_bound(self.p.used)),
        );
        if !fp.passed {
            rep.passed = false;
            rep.detail = format!(
                "{}; the CPU replay is off the f64 oracle: {}",
                rep.detail, fp.detail
            );
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.y)
    }
    fn bytes_per_call(&self) -> u64 {
        let valid = self.replay.len() as u64 / self.p.d_model.max(1) as u64;
        4 * (self.p.tokens * self.p.used * self.p.d_model) as u64
            + 4 * valid * self.p.d_model as u64
    }
    fn ops_per_call(&self) -> u64 {
        2 * (self.p.tokens * self.p.used * self.p.d_model) as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

struct GemmWorkload {
    weights: WeightSet,
    act: DeviceBuffer,
    sorted: DeviceBuffer,
    tiles: DeviceBuffer,
    offsets: DeviceBuffer,
    out: DeviceBuffer,
    /// The valid pairs in ascending order (the rows compared).
    valid: Vec<usize>,
    n_out: usize,
    stage: Stage,
    p: MoeProblem,
    geo: LaunchGeometry,
    reference: super::RefFn,
    bytes: u64,
    ops: u64,
}

impl GemmWorkload {
    fn kargs(&self, copy: usize) -> Vec<KArg> {
        let planes = self.weights.get(copy);
        let w = ExpertWeights {
            q: planes[0].ptr(),
            d: planes.get(1).map_or(NULL, |b| b.ptr()),
        };
        let p = &self.p;
        match self.stage {
            Stage::GateUp => MoeGemmGateUpArgs {
                w,
                x: self.act.ptr(),
                sorted: self.sorted.ptr(),
                tiles: self.tiles.ptr(),
                offsets: self.offsets.ptr(),
                h: self.out.ptr(),
                d: p.d_model,
                ffn: p.ffn,
                n_used: p.used,
            }
            .kargs(),
            _ => MoeGemmDownArgs {
                w,
                h: self.act.ptr(),
                sorted: self.sorted.ptr(),
                tiles: self.tiles.ptr(),
                offsets: self.offsets.ptr(),
                yp: self.out.ptr(),
                d: p.d_model,
                ffn: p.ffn,
            }
            .kargs(),
        }
    }
}

/// The rows of `out` (`[pairs][n]`) of the valid pairs, in order, and the
/// count of words written in the other (skipped) rows.
pub(crate) fn split_rows(
    out: &[f32],
    valid: &[usize],
    pairs: usize,
    n: usize,
) -> (Vec<f32>, usize) {
    let mut rows = Vec::with_capacity(valid.len() * n);
    for &q in valid {
        rows.extend_from_slice(&out[q * n..(q + 1) * n]);
    }
    let mut is_valid = vec![false; pairs];
    for &q in valid {
        is_valid[q] = true;
    }
    let written = (0..pairs)
        .filter(|&q| !is_valid[q])
        .map(|q| {
            out[q * n..(q + 1) * n]
                .iter()
                .filter(|v| v.to_bits() != POISON_BITS)
                .count()
        })
        .sum();
    (rows, written)
}

impl Workload for GemmWorkload {
    fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.weights.set_copies(gpu, n)
    }
    fn weight_copies(&self) -> usize {
        self.weights.copies.len()
    }
    fn launch(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        gpu.launch(m, &self.geo, &self.kargs(copy))
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.out])
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let out: Vec<f32> = gpu.download(&self.out)?;
        let pairs = self.p.tokens * self.p.used;
        let (rows, written) = split_rows(&out, &self.valid, pairs, self.n_out);
        let (reference, replay) = (self.reference)();
        let mut rep = compare(&rows, &reference, replay.as_deref(), contract, tol);
        if written > 0 {
            rep.passed = false;
            rep.detail = format!(
                "{}; {written} words written in the rows of skipped pairs",
                rep.detail
            );
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.out)
    }
    fn bytes_per_call(&self) -> u64 {
        self.bytes
    }
    fn ops_per_call(&self) -> u64 {
        self.ops
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;

    fn mp(
        tokens: usize,
        experts: usize,
        used: usize,
        d: usize,
        ffn: usize,
        t: GgmlType,
    ) -> MoeProblem {
        MoeProblem {
            tokens,
            d_model: d,
            ffn,
            experts,
            used,
            wtype: t,
        }
    }
    fn prob(
        tokens: usize,
        experts: usize,
        used: usize,
        d: usize,
        ffn: usize,
        t: GgmlType,
    ) -> Problem {
        Problem::Moe(mp(tokens, experts, used, d, ffn, t))
    }
    fn with(d: &Defines, kv: &[(&str, DefineValue)]) -> Defines {
        let mut d = d.clone();
        for (k, v) in kv {
            d.insert((*k).into(), v.clone());
        }
        d
    }

    #[test]
    fn validate_gives_every_stage_its_geometry() {
        let f = MoeGemm;
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = f.default_defines(GgmlType::Q8_0);
        // 26B-A4B at pp2048: 16384 pairs, BM 64 -> 256 + 128 tiles.
        let p = prob(2048, 128, 8, 2816, 704, GgmlType::Q8_0);
        let g = f.validate(&d, &p, &lim).expect("gate_up");
        assert_eq!(g.kernel, "moe_gemm_gate_up");
        assert_eq!(g.grid, (11, 384, 1));
        assert_eq!(g.block, (256, 1, 1));
        // 3 stages x (64 x 320 + 128 x 80 + 128 x 4).
        assert_eq!(g.dyn_smem, 3 * (64 * 320 + 128 * 80 + 128 * 4));
        let g = f
            .validate(&with(&d, &[("STAGE", "DOWN".into())]), &p, &lim)
            .expect("down");
        assert_eq!(g.kernel, "moe_gemm_down");
        assert_eq!(g.grid, (22, 384, 1));
        let g = f
            .validate(&with(&d, &[("STAGE", "GROUP".into())]), &p, &lim)
            .expect("group");
        assert_eq!(
            (g.kernel.as_str(), g.grid, g.block),
            ("moe_gemm_group", (1, 1, 1), (1024, 1, 1))
        );
        let g = f
            .validate(&with(&d, &[("STAGE", "COMBINE".into())]), &p, &lim)
            .expect("combine");
        assert_eq!(
            (g.kernel.as_str(), g.grid, g.block),
            ("moe_gemm_combine", (3, 2048, 1), (256, 1, 1))
        );
        // BF16 operands and 128-row tiles.
        let g = f
            .validate(
                &with(&d, &[("BM", 128i64.into()), ("DQ_TYPE", "BF16".into())]),
                &p,
                &lim,
            )
            .expect("bm128");
        assert_eq!(g.grid, (11, 128 + 128, 1));
        // Q4_K GATE_UP: the side record (16 bytes) per row per stage.
        let k4 = f.default_defines(GgmlType::Q4K);
        let g = f
            .validate(&k4, &prob(512, 128, 8, 2816, 704, GgmlType::Q4K), &lim)
            .expect("q4k");
        assert_eq!(g.dyn_smem, 3 * (64 * 320 + 128 * 48 + 128 * 16));
        // SMEM_DQ: the converted tiles after the ring, pitch PAD16(2*BK).
        let ring = 3 * (64 * 320 + 128 * 80 + 128 * 4);
        let g = f
            .validate(&with(&d, &[("SMEM_DQ", 1i64.into())]), &p, &lim)
            .expect("sdq1");
        assert_eq!(g.dyn_smem, ring + 128 * 144);
        let g = f
            .validate(&with(&d, &[("SMEM_DQ", 2i64.into())]), &p, &lim)
            .expect("sdq2");
        assert_eq!(g.dyn_smem, ring + (64 + 128) * 144);
        let g = f
            .validate(
                &with(
                    &d,
                    &[
                        ("SMEM_DQ", 2i64.into()),
                        ("BK", 32i64.into()),
                        ("STAGES", 4i64.into()),
                    ],
                ),
                &p,
                &lim,
            )
            .expect("sdq2 bk32");
        assert_eq!(
            g.dyn_smem,
            4 * (64 * 192 + 128 * 48 + 128 * 4) + (64 + 128) * 80
        );
        let g = f
            .validate(&with(&d, &[("SMEM_DQ", 3i64.into())]), &p, &lim)
            .expect("sdq3");
        assert_eq!(g.dyn_smem, ring + 2 * (64 + 128) * 144);
    }

    #[test]
    fn validate_rejects_bad_points_with_reasons() {
        let f = MoeGemm;
        let lim = DeviceLimits::for_arch(Arch(90));
        let bad = |d: &Defines, p: Problem, want: &str| {
            let e = f.validate(d, &p, &lim).expect_err(want);
            assert!(e.contains(want), "{e}");
        };
        let d = f.default_defines(GgmlType::Q8_0);
        let p = prob(64, 128, 8, 2816, 704, GgmlType::Q8_0);
        bad(
            &d,
            prob(4097, 128, 8, 2816, 704, GgmlType::Q8_0),
            "up to 4096 tokens",
        );
        bad(
            &d,
            prob(8, 300, 8, 2816, 704, GgmlType::Q8_0),
            "at most 256",
        );
        bad(&d, prob(8, 64, 40, 2816, 704, GgmlType::Q8_0), "at most 32");
        bad(
            &d,
            prob(8, 16, 4, 2816, 700, GgmlType::Q8_0),
            "multiples of 32",
        );
        // Q8_0 / Q4_0 need k % 64 (scale words); 2848 = 89 * 32.
        bad(
            &d,
            prob(8, 16, 4, 2848, 704, GgmlType::Q8_0),
            "not a multiple of 64",
        );
        let down = with(&d, &[("STAGE", "DOWN".into())]);
        bad(
            &down,
            prob(8, 16, 4, 2816, 736, GgmlType::Q8_0),
            "down (k = ffn)",
        );
        // Q4_K down at 704: not whole super-blocks.
        let k4 = f.default_defines(GgmlType::Q4K);
        bad(
            &with(&k4, &[("STAGE", "DOWN".into())]),
            prob(8, 128, 8, 2816, 704, GgmlType::Q4K),
            "256-element q4_K block",
        );
        bad(&with(&d, &[("LAYOUT", 0i64.into())]), p, "LAYOUT=1");
        bad(&with(&d, &[("STAGE", "UP".into())]), p, "STAGE=UP");
        bad(&with(&d, &[("DQ_TYPE", "F32".into())]), p, "DQ_TYPE=F32");
        bad(&with(&d, &[("BK", 16i64.into())]), p, "BK");
        bad(&with(&d, &[("STAGES", 1i64.into())]), p, "STAGES");
        bad(&with(&d, &[("SMEM_DQ", 4i64.into())]), p, "SMEM_DQ=4");
        bad(
            &with(&d, &[("SMEM_DQ", "ON".into())]),
            p,
            "SMEM_DQ=ON must be an integer",
        );
        bad(&with(&d, &[("BM", 48i64.into())]), p, "16*WARPS_M");
        bad(&with(&d, &[("BN", 96i64.into())]), p, "gate and an up half");
        // DOWN takes BN in 8-column units per warp.
        f.validate(
            &with(&down, &[("BN", 96i64.into()), ("WARPS_N", 4i64.into())]),
            &p,
            &lim,
        )
        .expect("down BN=96");
        bad(
            &with(&d, &[("BM", 128i64.into()), ("BN", 256i64.into())]),
            p,
            "> 64",
        );
        bad(
            &with(&d, &[("BK", 128i64.into()), ("BM", 128i64.into())]),
            p,
            "BK=128",
        );
        let k6 = f.default_defines(GgmlType::Q6K);
        bad(
            &with(&k6, &[("WARPS_M", 1i64.into())]),
            prob(8, 8, 2, 512, 256, GgmlType::Q6K),
            "64-row warp tiles",
        );
        bad(
            &with(
                &k6,
                &[
                    ("BM", 128i64.into()),
                    ("BN", 256i64.into()),
                    ("WARPS_M", 4i64.into()),
                    ("WARPS_N", 4i64.into()),
                    ("BK", 32i64.into()),
                ],
            ),
            prob(8, 8, 2, 512, 256, GgmlType::Q6K),
            "128-register cap",
        );
        bad(&with(&d, &[("WTYPE", "Q4_0".into())]), p, "does not match");
        bad(
            &d,
            Problem::matmul(1, 8, 64, GgmlType::Q8_0),
            "runs on moe shapes",
        );
        // Every legal type at its edge sizes validates in both GEMM stages.
        for (t, dm, ff) in [
            (GgmlType::Q8_0, 128, 64),
            (GgmlType::Q4_0, 256, 128),
            (GgmlType::Q4K, 512, 256),
            (GgmlType::Q5K, 256, 256),
            (GgmlType::Q6K, 512, 256),
            (GgmlType::F16, 96, 160),
            (GgmlType::Bf16, 224, 96),
        ] {
            for st in ["GATE_UP", "DOWN"] {
                let dd = with(&f.default_defines(t), &[("STAGE", st.into())]);
                f.validate(&dd, &prob(33, 8, 2, dm, ff, t), &lim)
                    .unwrap_or_else(|e| panic!("{t:?} {st}: {e}"));
            }
        }
    }

    #[test]
    fn routing_has_empty_single_multi_tile_experts_and_skipped_pairs() {
        let p = mp(133, 16, 4, 512, 256, GgmlType::Q8_0);
        let mut rng = rng_for("moe-gemm-routing-test", &[1], 1);
        let (ids, w) = gemm_routing(&mut rng, &p);
        let g = group_by_expert(&ids, 16, 64);
        // Expert 15 holds exactly the first pair.
        assert_eq!(g.counts[15], 1);
        assert_eq!(ids[0], 15);
        // The skew gives some experts several 64-row tiles; and the
        // skipped pairs use every invalid id form.
        assert!(
            g.counts.iter().filter(|&&c| c > 64).count() >= 2,
            "{:?}",
            g.counts
        );
        let skipped: Vec<i32> = ids.iter().copied().filter(|&e| !valid_id(e, 16)).collect();
        assert!(
            skipped.len() > 20 && skipped.len() < 80,
            "{}",
            skipped.len()
        );
        for bad in [-1, -7, i32::MAX, 16] {
            assert!(skipped.contains(&bad), "{bad}");
        }
        for t in 0..133 {
            let row: Vec<i32> = ids[4 * t..4 * t + 4]
                .iter()
                .copied()
                .filter(|&e| valid_id(e, 16))
                .collect();
            let mut u = row.clone();
            u.sort_unstable();
            u.dedup();
            assert_eq!(u.len(), row.len(), "token {t}: {row:?}");
            let s: f32 = w[4 * t..4 * t + 4].iter().sum();
            assert!((s - 1.0).abs() < 1e-5);
        }
        // Few tokens over many experts: empty experts.
        let p = mp(5, 128, 8, 2816, 704, GgmlType::Q8_0);
        let (ids, _) = gemm_routing(&mut rng, &p);
        let g = group_by_expert(&ids, 128, 64);
        assert!(g.counts.iter().filter(|&&c| c == 0).count() > 80);
        assert_eq!(g.counts[127], 1);
        // Every expert chosen by every token: nothing reserved.
        let p = mp(3, 4, 4, 128, 64, GgmlType::Q8_0);
        let (ids, _) = gemm_routing(&mut rng, &p);
        assert_eq!(ids[..4].iter().filter(|&&e| valid_id(e, 4)).count(), 4);
    }

    #[test]
    fn group_report_accepts_any_order_inside_a_group_and_names_errors() {
        let ids = [2, 0, 4, 2, -1, 0, 2, 0, 5, 2, 1, 0];
        let want = group_by_expert(&ids, 5, 2);
        let flat = |g: &MoeGrouping, sorted: Vec<i32>| -> Vec<i32> {
            canonical_group(
                g.counts.clone(),
                g.offsets.clone(),
                sorted,
                g.tiles.iter().flat_map(|t| [t[0], t[1]]).collect(),
                g,
            )
        };
        // Expert 0's and 2's pairs reversed, and poison past the valid count.
        let mut s = want.sorted.clone();
        s[0..4].reverse();
        s[5..9].reverse();
        s.extend([POISON_BITS as i32; 2]);
        let rep = group_report(&flat(&want, s.clone()), &want);
        assert!(rep.passed, "{}", rep.detail);
        // A pair moved into another expert's group fails.
        let mut s2 = s.clone();
        s2.swap(3, 4);
        let rep = group_report(&flat(&want, s2), &want);
        assert!(!rep.passed);
        assert!(rep.detail.contains("sorted["), "{}", rep.detail);
        // A wrong tile entry and an unwritten count are named.
        let mut w2 = want.clone();
        w2.tiles[1] = [0, 3];
        w2.counts[3] = POISON_BITS as i32;
        let got = canonical_group(
            w2.counts.clone(),
            w2.offsets.clone(),
            s,
            w2.tiles.iter().flat_map(|t| [t[0], t[1]]).collect(),
            &want,
        );
        let rep = group_report(&got, &want);
        assert!(!rep.passed);
        assert_eq!(rep.unwritten, 1);
        assert!(
            rep.detail.contains("tiles[3] = 3 (want 2)"),
            "{}",
            rep.detail
        );
        assert!(rep.detail.contains("counts[3]"), "{}", rep.detail);
    }

    #[test]
    fn combine_replay_is_the_oracle_in_f32_and_skips_nan_rows() {
        let p = mp(7, 6, 3, 64, 32, GgmlType::Q8_0);
        let inp = gemm_inputs(&p, Stage::Combine, None, 3).expect("inputs");
        assert!(inp.ids.iter().any(|&e| !valid_id(e, 6)));
        let r = combine_replay(&inp.act, &inp.ids, &inp.weights, &p);
        let o = combine_experts(&inp.act, &inp.ids, &inp.weights, 7, 64, 6, 3);
        assert!(r.iter().all(|v| v.is_finite()));
        for (a, b) in r.iter().zip(&o) {
            assert!(
                (*a as f64 - b).abs() <= 1e-5 * (1.0 + b.abs()),
                "{a} vs {b}"
            );
        }
    }

    #[test]
    fn split_rows_takes_valid_rows_and_counts_writes_elsewhere() {
        let poison = f32::from_bits(POISON_BITS);
        let out = [1.0, 2.0, poison, poison, 5.0, 6.0, poison, 7.0];
        let (rows, written) = split_rows(&out, &[0, 2], 4, 2);
        assert_eq!(rows, vec![1.0, 2.0, 5.0, 6.0]);
        assert_eq!(written, 1);
    }

    /// GATE_UP's reference fed to DOWN's, weighted by COMBINE's oracle,
    /// equals `oracle::moe_ffn` on the same experts (skipped pairs at
    /// weight 0); the replays with rounded operands stay within the
    /// tolerance the family gives the GPU.
    #[test]
    fn stage_references_compose_to_the_oracle() {
        let p = mp(9, 6, 3, 128, 64, GgmlType::Q8_0);
        let gu = gemm_inputs(&p, Stage::GateUp, Some(WType::Q8_0), 5).expect("gate_up");
        let valid: Vec<usize> = (0..27).filter(|&q| valid_id(gu.ids[q], 6)).collect();
        let h = gemm_reference(&p, Stage::GateUp, &gu, &valid, None);
        let h_rp = gemm_reference(&p, Stage::GateUp, &gu, &valid, Some(false));
        let rel = |a: &[f64], b: &[f64]| -> f64 {
            let e: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
            let r: f64 = b.iter().map(|y| y * y).sum();
            (e / r).sqrt()
        };
        let f = MoeGemm;
        let d = f.default_defines(GgmlType::Q8_0);
        let tol = f.default_tolerance(&d, &Problem::Moe(p));
        assert!(rel(&h_rp, &h) < tol.rms_rel, "{}", rel(&h_rp, &h));
        // DOWN on GATE_UP's h (skipped rows NaN) with the same routing.
        let mut dn = gemm_inputs(&p, Stage::Down, Some(WType::Q8_0), 5).expect("down");
        dn.ids = gu.ids.clone();
        dn.weights = gu.weights.clone();
        let mut hv = vec![f32::NAN; 27 * 64];
        for (i, &q) in valid.iter().enumerate() {
            for r in 0..64 {
                hv[q * 64 + r] = h[i * 64 + r] as f32;
            }
        }
        dn.act = hv;
        let chosen = distinct_experts(&valid.iter().map(|&q| gu.ids[q]).collect::<Vec<_>>());
        dn.tensor = Some(
            expert_tensor(
                "moe-gemm-compose",
                &[2],
                WType::Q8_0,
                6,
                128,
                64,
                &chosen,
                5,
            )
            .expect("down tensor"),
        );
        let yp = gemm_reference(&p, Stage::Down, &dn, &valid, None);
        let mut ypf = vec![f32::NAN; 27 * 128];
        for (i, &q) in valid.iter().enumerate() {
            for r in 0..128 {
                ypf[q * 128 + r] = yp[i * 128 + r] as f32;
            }
        }
        let y = combine_experts(&ypf, &gu.ids, &gu.weights, 9, 128, 6, 3);
        let full = |t: &ExpertTensor, rows: usize, k: usize| -> Vec<f32> {
            (0..6)
                .flat_map(|e| {
                    t.deq
                        .get(&e)
                        .cloned()
                        .unwrap_or_else(|| vec![0f32; rows * k])
                })
                .collect()
        };
        let ids: Vec<usize> = gu
            .ids
            .iter()
            .map(|&e| if valid_id(e, 6) { e as usize } else { 0 })
            .collect();
        let w0: Vec<f32> = gu
            .weights
            .iter()
            .zip(&gu.ids)
            .map(|(&w, &e)| if valid_id(e, 6) { w } else { 0.0 })
            .collect();
        let mut out = vec![0f32; 9 * 128];
        let gt = gu.tensor.as_ref().expect("gate_up tensor");
        let dt = dn.tensor.as_ref().expect("down tensor");
        crate::oracle::moe_ffn(
            &gu.act,
            &full(gt, 128, 128),
            &full(dt, 128, 64),
            &ids,
            &w0,
            9,
            128,
            64,
            3,
            &mut out,
        );
        for (i, (&o, &r)) in out.iter().zip(&y).enumerate() {
            assert!(
                (o as f64 - r).abs() <= 1e-5 * (1.0 + r.abs()),
                "{i}: {o} vs {r}"
            );
        }
    }
}
