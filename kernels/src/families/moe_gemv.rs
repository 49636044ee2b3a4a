//! `moe_gemv`: the chosen experts' gated FFN for a decode step (1..8
//! tokens), in two stages selected by `STAGE` (GATE_UP, DOWN), each checked
//! on its own inputs. See kernels/cuda/moe_gemv.cu and `bind::moe`.
//!
//! The check routes every token to `used` distinct experts drawn at random
//! (tokens share experts wherever the draws meet, and always on the
//! few-expert shapes); only the chosen experts carry their own random
//! weights, every other expert holds one shared decoy expert, so a kernel
//! that reads a wrong expert fails the comparison. With COUNT_BYTES=1 the
//! check also requires the kernel's per-expert byte counts to be exactly
//! the chosen experts' bytes, each expert once, and zero for the others.
//!
//! `ALGO=1` (dp4a on Q8_1 activations each block makes in shared memory)
//! and `ALGO=2` (dp4a on split Q8 records, about 15 bits, made the same
//! way) are the approx contract: besides the f64 reference, the check
//! replays the stage in f64 on the activations' quantized values
//! (`q8_1_replay`, `split_q8_replay`: the rules the kernel applies), which
//! the kernel must match tightly.

use super::gemv::{dp4a_tolerance, fp_rms_bound, ActNoise};
use super::{
    gelu_tanh_f64, make_weights, memo, q8_1_replay, random_matrix, rng_for, split_q8_replay,
    QWeights,
};
use crate::bind::moe::{expert_binding, ExpertWeights, MoeDownArgs, MoeGateUpArgs};
use crate::bind::NULL;
use crate::defines::{defines, get_str, int_in, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::kernel_family::Family;
use crate::problem::{check_wtype, moe_of, MatmulProblem, MoeProblem, Problem, ProblemKind, WType};
use crate::quant::GgmlType;
use crate::verdict::{compare, CheckReport, Contract, Tolerance};
use crate::workload::{poison, OpKind, WeightSet, Workload};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

pub struct MoeGemv;

/// Most experts per token the grouping holds (MAX_USED of moe_gemv.cu).
pub const MAX_USED: usize = 32;

/// Which half of the expert FFN a variant computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// `h = gelu(gate x) * (up x)` per (token, slot).
    GateUp,
    /// `y = sum_j w_j down h_j` per token.
    Down,
}

impl Stage {
    pub fn of(d: &Defines) -> Result<Stage, String> {
        match get_str(d, "STAGE")?.as_str() {
            "GATE_UP" => Ok(Stage::GateUp),
            "DOWN" => Ok(Stage::Down),
            s => Err(format!("STAGE={s} is not GATE_UP or DOWN")),
        }
    }
    /// The expert tensor as one matrix: (rows per expert, row length).
    pub fn matrix(self, p: &MoeProblem) -> (usize, usize) {
        match self {
            Stage::GateUp => (2 * p.ffn, p.d_model),
            Stage::Down => (p.d_model, p.ffn),
        }
    }
}

/// The expert tensor's weight type and layout checks (the dense GEMV's
/// rules on a matrix of `E * rows` rows of `k`).
fn check_weights(d: &Defines, p: &MoeProblem, stage: Stage) -> Result<WType, String> {
    let (rows, k) = stage.matrix(p);
    let mp = MatmulProblem {
        m: p.tokens,
        n: p.experts * rows,
        k,
        wtype: p.wtype,
    };
    let wt = check_wtype(d, &mp).map_err(|e| match stage {
        Stage::GateUp => format!("gate_up (k = d_model): {e}"),
        Stage::Down => format!("down (k = ffn): {e}"),
    })?;
    let layout = int_in(d, "LAYOUT", &[0, 1])?;
    if matches!(wt, WType::Q4K | WType::Q5K) && layout != 1 {
        return Err(format!(
            "{} weights need LAYOUT=1: the kernel reads their nibble plane and side records",
            wt.define()
        ));
    }
    if wt.is_16bit() && k % 8 != 0 {
        return Err(format!(
            "k={k} is not a multiple of 8: {} rows are read in 16-byte pieces",
            wt.define()
        ));
    }
    Ok(wt)
}

/// The dynamic shared memory of ALGO `algo`: the quantized activations a
/// block makes (GATE_UP: x of every token; DOWN: h of every (token, slot)
/// pair), ALGO 1 one byte per value and an 8-byte (d, sum) pair per 32,
/// ALGO 2 an 80-byte split record per 32; ALGO 0 none.
pub fn q8_smem_bytes(p: &MoeProblem, stage: Stage, algo: i64) -> usize {
    let n = match stage {
        Stage::GateUp => p.tokens * p.d_model,
        Stage::Down => p.tokens * p.used * p.ffn,
    };
    match algo {
        1 => n + n / 32 * 8,
        2 => n / 32 * crate::bind::Q8_SPLIT_RECORD,
        _ => 0,
    }
}

/// An upper bound of the kernel's static shared memory: the grouping
/// (`Groups<NT>` and its two scratch arrays over NT * MAX_USED pairs) and
/// DOWN's split-K slices.
fn static_smem_bound(tokens: usize, warps: usize, rows: usize) -> usize {
    let np = tokens * MAX_USED;
    4 + np * (4 + 4 + 2 * tokens + tokens) + np * (4 + 2) + warps * rows * tokens * 4 + 64
}

/// Each token's `used` distinct experts, drawn uniformly, and positive
/// weights summing to one per token, `[tokens][used]`.
pub(crate) fn check_routing(rng: &mut ChaCha8Rng, p: &MoeProblem) -> (Vec<i32>, Vec<f32>) {
    let mut ids = Vec::with_capacity(p.tokens * p.used);
    let mut weights = Vec::with_capacity(p.tokens * p.used);
    for _ in 0..p.tokens {
        let mut pool: Vec<i32> = (0..p.experts as i32).collect();
        for j in 0..p.used {
            let pick = rng.random_range(j..pool.len());
            pool.swap(j, pick);
        }
        ids.extend_from_slice(&pool[..p.used]);
        let w: Vec<f32> = (0..p.used)
            .map(|_| rng.random_range(0.05f32..1.0))
            .collect();
        let s: f32 = w.iter().sum();
        weights.extend(w.iter().map(|v| v / s));
    }
    (ids, weights)
}

/// The distinct experts of `ids` in order of first appearance (the
/// kernel's grouping order).
pub fn distinct_experts(ids: &[i32]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for &e in ids {
        if e >= 0 && !out.contains(&(e as usize)) {
            out.push(e as usize);
        }
    }
    out
}

/// A whole expert tensor of `experts` experts of `rows` x `k` (every
/// buffer of `QWeights` for all of them, `deq` left empty) and the exact
/// values of the chosen experts. Unchosen experts hold the decoy.
pub(crate) struct ExpertTensor {
    pub all: QWeights,
    pub deq: BTreeMap<usize, Vec<f32>>,
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_tensor(
    tag: &str,
    dims: &[usize],
    wt: WType,
    experts: usize,
    rows: usize,
    k: usize,
    chosen: &[usize],
    seed: u64,
) -> Result<ExpertTensor, GpuError> {
    use rayon::prelude::*;
    let gen = |e: usize| -> Result<QWeights, GpuError> {
        let mut d = dims.to_vec();
        d.push(e);
        make_weights(&mut rng_for(tag, &d, seed), wt, rows, k)
    };
    let decoy = gen(usize::MAX)?;
    let own: Vec<(usize, QWeights)> = chosen
        .par_iter()
        .map(|&e| gen(e).map(|w| (e, w)))
        .collect::<Result<_, _>>()?;
    let pick = |e: usize| own.iter().find(|(c, _)| *c == e).map_or(&decoy, |(_, w)| w);
    let cat = |f: &dyn Fn(&QWeights) -> &[u8]| -> Vec<u8> {
        let mut v = Vec::with_capacity(f(&decoy).len() * experts);
        for e in 0..experts {
            v.extend_from_slice(f(pick(e)));
        }
        v
    };
    let mut dplane_f16 = Vec::with_capacity(decoy.dplane_f16.len() * experts);
    for e in 0..experts {
        dplane_f16.extend_from_slice(&pick(e).dplane_f16);
    }
    let all = QWeights {
        gguf: cat(&|w| &w.gguf),
        deq: Vec::new(),
        qplane: cat(&|w| &w.qplane),
        dplane_f16,
        side_gemv: cat(&|w| &w.side_gemv),
        side_gemm: cat(&|w| &w.side_gemm),
    };
    let deq = own.into_iter().map(|(e, w)| (e, w.deq)).collect();
    Ok(ExpertTensor { all, deq })
}

/// A check's inputs for one (problem, stage, seed).
struct MoeInputs {
    ids: Vec<i32>,
    weights: Vec<f32>,
    /// x `[tokens][d]` (GATE_UP) or h `[tokens*used][ffn]` (DOWN).
    act: Vec<f32>,
    tensor: ExpertTensor,
}

fn moe_inputs(p: &MoeProblem, stage: Stage, wt: WType, seed: u64) -> Result<MoeInputs, GpuError> {
    let (rows, k) = stage.matrix(p);
    let dims = [
        p.tokens,
        p.d_model,
        p.ffn,
        p.experts,
        p.used,
        wt as usize,
        stage as usize,
    ];
    let mut rng = rng_for("moe_gemv", &dims, seed);
    let (ids, weights) = check_routing(&mut rng, p);
    let act = match stage {
        Stage::GateUp => random_matrix(&mut rng, p.tokens, p.d_model),
        Stage::Down => random_matrix(&mut rng, p.tokens * p.used, p.ffn),
    };
    let chosen = distinct_experts(&ids);
    let tensor = expert_tensor("moe_gemv", &dims, wt, p.experts, rows, k, &chosen, seed)?;
    Ok(MoeInputs {
        ids,
        weights,
        act,
        tensor,
    })
}

/// The f64 reference of a stage on its inputs: GATE_UP `h [tokens*used][ffn]`,
/// DOWN `y [tokens][d]`.
fn reference(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    let act: Vec<f64> = inp.act.iter().map(|&v| v as f64).collect();
    reference_on(p, stage, inp, &act)
}

/// ALGO 1's replay: the stage in f64 on the Q8_1 values of the
/// activations (`q_i * d` of each 32-value block, exact in f64), the
/// values the kernel's integer dot products and per-block scales stand for.
fn replay_q8_1(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    let (q, ds) = q8_1_replay(&inp.act);
    let act: Vec<f64> = q
        .iter()
        .enumerate()
        .map(|(i, &v)| v as f64 * ds[i / 32][0] as f64)
        .collect();
    reference_on(p, stage, inp, &act)
}

/// ALGO 2's replay: the stage in f64 on the values of the activations'
/// split Q8 records (`d1 q1 + d2 q2` per value).
fn replay_split(p: &MoeProblem, stage: Stage, inp: &MoeInputs) -> Vec<f64> {
    reference_on(p, stage, inp, &split_q8_replay(&inp.act))
}

/// A stage in f64 on `act` (in place of the inputs' activations).
fn reference_on(p: &MoeProblem, stage: Stage, inp: &MoeInputs, act: &[f64]) -> Vec<f64> {
    use rayon::prelude::*;
    let (d, ff, k) = (p.d_model, p.ffn, p.used);
    let dot =
        |w: &[f32], x: &[f64]| -> f64 { w.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum::<f64>() };
    let deq = |e: i32| -> &[f32] { &inp.tensor.deq[&(e as usize)] };
    match stage {
        Stage::GateUp => (0..p.tokens * k)
            .into_par_iter()
            .flat_map_iter(|pair| {
                let t = pair / k;
                let w = deq(inp.ids[pair]);
                let x = &act[t * d..(t + 1) * d];
                (0..ff)
                    .map(|r| {
                        let g = dot(&w[r * d..(r + 1) * d], x);
                        let u = dot(&w[(ff + r) * d..(ff + r + 1) * d], x);
                        gelu_tanh_f64(g) * u
                    })
                    .collect::<Vec<f64>>()
            })
            .collect(),
        Stage::Down => (0..p.tokens)
            .into_par_iter()
            .flat_map_iter(|t| {
                (0..d)
                    .map(|r| {
                        (0..k)
                            .map(|j| {
                                let pair = t * k + j;
                                let w = deq(inp.ids[pair]);
                                let h = &act[pair * ff..(pair + 1) * ff];
                                inp.weights[pair] as f64 * dot(&w[r * ff..(r + 1) * ff], h)
                            })
                            .sum::<f64>()
                    })
                    .collect::<Vec<f64>>()
            })
            .collect(),
    }
}

impl Family for MoeGemv {
    fn name(&self) -> &'static str {
        "moe_gemv"
    }
    fn entry(&self) -> &'static str {
        "moe_gemv"
    }
    fn source_file(&self) -> &'static str {
        "moe_gemv.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Moe
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        // Q6_K: its GGUF super-blocks (as the dense GEMV's default);
        // every other type: planes.
        let layout = if wtype == GgmlType::Q6K { 0 } else { 1 };
        let mut d = defines([
            ("LAYOUT", layout),
            ("ROWS", 1i64),
            ("WARPS", 4),
            ("UNROLL", 1),
            ("KSPLIT", 1),
            ("COUNT_BYTES", 0),
            ("ALGO", 0),
        ]);
        d.insert("STAGE".into(), DefineValue::Str("GATE_UP".into()));
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match d.get("ALGO") {
            Some(DefineValue::Int(1 | 2)) => Contract::Approx,
            _ => Contract::Fp,
        }
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        // DOWN sums `used` dot products of length ffn per output.
        let stage = Stage::of(d);
        let k = match (moe_of(p), &stage) {
            (Ok(m), Ok(Stage::GateUp)) => m.d_model,
            (Ok(m), Ok(Stage::Down)) => m.ffn * m.used,
            _ => 32,
        };
        let fp = fp_rms_bound(k);
        // As the dense dp4a GEMV's: GATE_UP's gelu(g) * u is its fused form.
        let gelu = matches!(stage, Ok(Stage::GateUp));
        match (self.contract(d), d.get("ALGO")) {
            (Contract::Approx, Some(DefineValue::Int(2))) => {
                dp4a_tolerance(ActNoise::Split, gelu, fp)
            }
            (Contract::Approx, _) => dp4a_tolerance(ActNoise::Q8_1, gelu, fp),
            _ => Tolerance::fp(fp),
        }
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = moe_of(p)?;
        let stage = Stage::of(d)?;
        let wt = check_weights(d, mp, stage)?;
        let rows = int_in(d, "ROWS", &[1, 2, 4])?;
        let warps = int_in(d, "WARPS", &[1, 2, 4, 8])?;
        let unroll = int_in(d, "UNROLL", &[1, 2, 4, 8])?;
        let ksplit = int_in(d, "KSPLIT", &[1, 2, 4, 8])?;
        if warps % ksplit != 0 {
            return Err(format!("KSPLIT={ksplit} does not divide WARPS={warps}"));
        }
        if stage == Stage::GateUp && ksplit != 1 {
            return Err(format!(
                "KSPLIT={ksplit}: GATE_UP's warps each own their rows (KSPLIT applies to DOWN)"
            ));
        }
        // The chunks a lane holds at once: GATE_UP loads a gate and an up
        // chunk per row, DOWN one per row.
        let budget = match stage {
            Stage::GateUp => 8,
            Stage::Down => 16,
        };
        if rows * unroll > budget {
            return Err(format!(
                "ROWS={rows} x UNROLL={unroll} chunks per lane exceed the {stage:?} stage's register budget of {budget}"
            ));
        }
        // A k-quant chunk carries its sub-block scales (and Q5_K / Q6_K
        // high bits): GATE_UP at eight tokens spills with several rows
        // and several chunks at once.
        if stage == Stage::GateUp && wt.is_kquant() && rows > 1 && unroll > 1 {
            return Err(format!(
                "ROWS={rows} x UNROLL={unroll}: k-quant gate_up chunks exceed the register budget (one of ROWS, UNROLL must be 1)"
            ));
        }
        int_in(d, "COUNT_BYTES", &[0, 1])?;
        let algo = int_in(d, "ALGO", &[0, 1, 2])?;
        let layout = int_in(d, "LAYOUT", &[0, 1])?;
        if algo != 0 && (wt.is_16bit() || (wt == WType::Q6K && layout == 0)) {
            return Err(format!(
                "ALGO={algo} (dp4a) reads Q8_0 / Q4_0 weights or k-quant planes, not {} on LAYOUT={layout}",
                wt.define()
            ));
        }
        if !(1..=8).contains(&mp.tokens) {
            return Err(format!(
                "moe_gemv handles 1..8 tokens (a decode step), not m={}",
                mp.tokens
            ));
        }
        if mp.used > MAX_USED {
            return Err(format!(
                "used = {}: the grouping holds at most {MAX_USED} experts per token",
                mp.used
            ));
        }
        // h rows (DOWN's activations) are read 16 bytes at a time.
        if mp.ffn % 4 != 0 {
            return Err(format!("ffn={} is not a multiple of 4", mp.ffn));
        }
        let (grid_x, grid_y, kernel) = match stage {
            Stage::GateUp => (
                mp.ffn,
                mp.experts.min(mp.tokens * mp.used),
                "moe_gemv_gate_up_n",
            ),
            Stage::Down => (mp.d_model, 1, "moe_gemv_down_n"),
        };
        if grid_y > 65535 {
            return Err(format!("{grid_y} expert groups exceed grid.y's 65535"));
        }
        let threads = (warps * 32) as u32;
        if threads > lim.max_threads_per_block {
            return Err(format!(
                "{threads} threads exceed the device's {}",
                lim.max_threads_per_block
            ));
        }
        let dyn_smem = q8_smem_bytes(mp, stage, algo);
        let smem = dyn_smem + static_smem_bound(mp.tokens, warps as usize, rows as usize);
        if smem > lim.max_smem_per_block as usize {
            return Err(format!(
                "ALGO={algo} at {} tokens: the quantized activations ({dyn_smem} bytes) and the grouping (about {} bytes) exceed the device's {} bytes of shared memory per block",
                mp.tokens,
                smem - dyn_smem,
                lim.max_smem_per_block
            ));
        }
        Ok(LaunchGeometry {
            kernel: format!("{kernel}{}", mp.tokens),
            grid: (
                grid_x.div_ceil((warps / ksplit * rows) as usize) as u32,
                grid_y as u32,
                1,
            ),
            block: (threads, 1, 1),
            dyn_smem: dyn_smem as u32,
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
        let mp = *moe_of(p).map_err(GpuError::Rejected)?;
        let stage = Stage::of(d).map_err(GpuError::Rejected)?;
        let wt = check_weights(d, &mp, stage).map_err(GpuError::Rejected)?;
        let count_bytes = int_in(d, "COUNT_BYTES", &[0, 1]).map_err(GpuError::Rejected)? == 1;
        let binding = expert_binding(d).map_err(GpuError::Rejected)?;
        let key = format!("moe_gemv inputs {mp:?} {stage:?} {seed}");
        let inp = memo::get_or_try(key, || moe_inputs(&mp, stage, wt, seed))?;
        let planes = inp.tensor.all.upload(gpu, wt, binding.layout)?;
        let (rows, k) = stage.matrix(&mp);
        let (qs, ds) = binding.row_strides(wt, k);
        let chosen = distinct_experts(&inp.ids);
        let expected: Vec<u64> = (0..mp.experts)
            .map(|e| {
                if chosen.contains(&e) {
                    (rows * (qs + ds)) as u64
                } else {
                    0
                }
            })
            .collect();
        let act = gpu.upload(&inp.act)?;
        let ids = gpu.upload(&inp.ids)?;
        let weights = gpu.upload(&inp.weights)?;
        let out_len = match stage {
            Stage::GateUp => mp.tokens * mp.used * mp.ffn,
            Stage::Down => mp.tokens * mp.d_model,
        };
        let out = gpu.alloc(out_len * 4)?;
        let count = gpu.alloc(mp.experts * 8)?;
        let active: u64 = expected.iter().sum();
        let out_bytes = (out_len * 4) as u64;
        let bytes = active + (inp.act.len() * 4) as u64 + out_bytes;
        let ops = 2 * (mp.tokens * mp.used * rows * k) as u64;
        let key = format!("moe_gemv ref {mp:?} {stage:?} {seed}");
        let inp2 = inp.clone();
        let algo = int_in(d, "ALGO", &[0, 1, 2]).map_err(GpuError::Rejected)?;
        let reference: super::RefFn = Box::new(move || {
            let r = memo::get(key.clone(), || reference(&mp, stage, &inp2));
            let replay = match algo {
                1 => Some(memo::get(format!("{key} replay q8_1"), || {
                    replay_q8_1(&mp, stage, &inp2)
                })),
                2 => Some(memo::get(format!("{key} replay split"), || {
                    replay_split(&mp, stage, &inp2)
                })),
                _ => None,
            };
            ((*r).clone(), replay.map(|rp| (*rp).clone()))
        });
        Ok(Box::new(MoeGemvWorkload {
            weights: WeightSet::new(planes),
            act,
            ids,
            route_weights: weights,
            out,
            count,
            count_bytes,
            expected,
            stage,
            p: mp,
            geo: geo.clone(),
            reference,
            bytes,
            ops,
        }))
    }
}

struct MoeGemvWorkload {
    weights: WeightSet,
    act: DeviceBuffer,
    ids: DeviceBuffer,
    route_weights: DeviceBuffer,
    out: DeviceBuffer,
    count: DeviceBuffer,
    count_bytes: bool,
    /// Bytes each expert's rows hold (0 for the unchosen).
    expected: Vec<u64>,
    stage: Stage,
    p: MoeProblem,
    geo: LaunchGeometry,
    reference: super::RefFn,
    bytes: u64,
    ops: u64,
}

impl MoeGemvWorkload {
    fn kargs(&self, copy: usize) -> Vec<KArg> {
        let planes = self.weights.get(copy);
        let w = ExpertWeights {
            q: planes[0].ptr(),
            d: planes.get(1).map_or(NULL, |b| b.ptr()),
        };
        let count = if self.count_bytes {
            self.count.ptr()
        } else {
            NULL
        };
        let p = &self.p;
        match self.stage {
            Stage::GateUp => MoeGateUpArgs {
                w,
                x: self.act.ptr(),
                ids: self.ids.ptr(),
                h: self.out.ptr(),
                count,
                d: p.d_model,
                ffn: p.ffn,
                n_experts: p.experts,
                n_used: p.used,
            }
            .kargs(),
            Stage::Down => MoeDownArgs {
                w,
                h: self.act.ptr(),
                ids: self.ids.ptr(),
                weights: self.route_weights.ptr(),
                y: self.out.ptr(),
                count,
                d: p.d_model,
                ffn: p.ffn,
                n_experts: p.experts,
                n_used: p.used,
            }
            .kargs(),
        }
    }
}

impl Workload for MoeGemvWorkload {
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
        if self.count_bytes {
            gpu.fill_u32(&self.count, 0)?;
        }
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
        let (reference, replay) = (self.reference)();
        let mut rep = compare(&out, &reference, replay.as_deref(), contract, tol);
        if self.count_bytes {
            let got: Vec<u64> = gpu.download(&self.count)?;
            if let Some(msg) = count_mismatch(&got, &self.expected) {
                rep.passed = false;
                rep.detail = format!("{}; {msg}", rep.detail);
            } else {
                rep.detail = format!(
                    "{}; bytes read: {} chosen experts, {} bytes, each once",
                    rep.detail,
                    self.expected.iter().filter(|&&b| b > 0).count(),
                    self.expected.iter().sum::<u64>()
                );
            }
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v: Vec<u32> = gpu.download(&self.out)?;
        if self.count_bytes {
            v.extend(gpu.download::<u32>(&self.count)?);
        }
        Ok(v)
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

/// Why per-expert byte counts differ from the expected ones (None: equal).
pub(crate) fn count_mismatch(got: &[u64], expected: &[u64]) -> Option<String> {
    let bad: Vec<String> = got
        .iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .take(4)
        .map(|(e, (g, w))| format!("expert {e}: {g} bytes read, {w} expected"))
        .collect();
    if bad.is_empty() && got.len() == expected.len() {
        None
    } else {
        Some(format!(
            "per-expert bytes read differ ({}{})",
            bad.join(", "),
            if got.len() != expected.len() {
                format!("; {} counters for {} experts", got.len(), expected.len())
            } else {
                String::new()
            }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::super::matmul_q8_replay;
    use super::*;
    use crate::compile::Arch;

    fn prob(
        tokens: usize,
        experts: usize,
        used: usize,
        d: usize,
        ffn: usize,
        t: GgmlType,
    ) -> Problem {
        Problem::Moe(MoeProblem {
            tokens,
            d_model: d,
            ffn,
            experts,
            used,
            wtype: t,
        })
    }

    fn with(d: &Defines, kv: &[(&str, DefineValue)]) -> Defines {
        let mut d = d.clone();
        for (k, v) in kv {
            d.insert((*k).into(), v.clone());
        }
        d
    }

    #[test]
    fn validate_gives_both_stages_their_geometry() {
        let f = MoeGemv;
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = f.default_defines(GgmlType::Q8_0);
        let p = prob(8, 128, 8, 2816, 704, GgmlType::Q8_0);
        let g = f.validate(&d, &p, &lim).expect("gate_up");
        assert_eq!(g.kernel, "moe_gemv_gate_up_n8");
        assert_eq!(g.grid, (176, 64, 1));
        let down = with(&d, &[("STAGE", "DOWN".into()), ("ROWS", 2i64.into())]);
        let g = f.validate(&down, &p, &lim).expect("down");
        assert_eq!(g.kernel, "moe_gemv_down_n8");
        assert_eq!(g.grid, (352, 1, 1));
        // KSPLIT warps share each group of rows: 4 warps, 2 groups of 2.
        let split = with(&down, &[("KSPLIT", 2i64.into())]);
        let g = f.validate(&split, &p, &lim).expect("down, split");
        assert_eq!((g.grid, g.block), ((704, 1, 1), (128, 1, 1)));
        // Few experts: one group per expert at most.
        let g = f
            .validate(&d, &prob(8, 8, 2, 256, 96, GgmlType::Q8_0), &lim)
            .expect("tiny");
        assert_eq!(g.grid, (24, 8, 1));
    }

    #[test]
    fn validate_rejects_bad_points_with_reasons() {
        let f = MoeGemv;
        let lim = DeviceLimits::for_arch(Arch(90));
        let bad = |d: &Defines, p: Problem, want: &str| {
            let e = f.validate(d, &p, &lim).expect_err(want);
            assert!(e.contains(want), "{e}");
        };
        let d = f.default_defines(GgmlType::Q8_0);
        let p = prob(1, 128, 8, 2816, 704, GgmlType::Q8_0);
        bad(
            &d,
            prob(9, 128, 8, 2816, 704, GgmlType::Q8_0),
            "1..8 tokens",
        );
        bad(&d, prob(1, 64, 40, 2816, 704, GgmlType::Q8_0), "at most 32");
        bad(&d, prob(1, 8, 9, 2816, 704, GgmlType::Q8_0), "used = 9");
        bad(
            &d,
            prob(1, 8, 2, 2832 + 8, 704, GgmlType::Q8_0),
            "gate_up (k = d_model)",
        );
        let down = with(&d, &[("STAGE", "DOWN".into())]);
        bad(
            &down,
            prob(1, 8, 2, 2816, 700, GgmlType::Q8_0),
            "down (k = ffn)",
        );
        // Q4_K on the 26B-A4B down projection: 704 is not whole super-blocks
        // (llama.cpp stores that tensor in another type).
        let k4 = f.default_defines(GgmlType::Q4K);
        f.validate(&k4, &prob(1, 128, 8, 2816, 704, GgmlType::Q4K), &lim)
            .expect("Q4_K gate_up");
        bad(
            &with(&k4, &[("STAGE", "DOWN".into())]),
            prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
            "256-element q4_K block",
        );
        bad(
            &with(&k4, &[("LAYOUT", 0i64.into())]),
            prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
            "need LAYOUT=1",
        );
        let f16 = f.default_defines(GgmlType::F16);
        bad(
            &with(&f16, &[("STAGE", "DOWN".into())]),
            prob(1, 8, 2, 64, 36, GgmlType::F16),
            "multiple of 8",
        );
        bad(&with(&d, &[("STAGE", "UP".into())]), p, "STAGE=UP");
        bad(&with(&d, &[("ROWS", 3i64.into())]), p, "ROWS=3");
        bad(&with(&d, &[("WARPS", 16i64.into())]), p, "WARPS=16");
        bad(&with(&d, &[("UNROLL", 3i64.into())]), p, "UNROLL=3");
        bad(&with(&d, &[("KSPLIT", 2i64.into())]), p, "applies to DOWN");
        let down = with(&d, &[("STAGE", "DOWN".into())]);
        bad(&with(&down, &[("KSPLIT", 3i64.into())]), p, "KSPLIT=3");
        bad(
            &with(&down, &[("KSPLIT", 8i64.into())]),
            p,
            "does not divide WARPS=4",
        );
        bad(
            &with(&d, &[("ROWS", 4i64.into()), ("UNROLL", 4i64.into())]),
            p,
            "register budget",
        );
        bad(
            &with(&k4, &[("ROWS", 2i64.into()), ("UNROLL", 2i64.into())]),
            prob(1, 128, 8, 2816, 704, GgmlType::Q4K),
            "k-quant gate_up",
        );
        bad(
            &with(&d, &[("COUNT_BYTES", 2i64.into())]),
            p,
            "COUNT_BYTES=2",
        );
        bad(&with(&d, &[("WTYPE", "Q4_0".into())]), p, "does not match");
        bad(
            &with(&d, &[("WTYPE", "F32".into())]),
            prob(1, 8, 2, 64, 32, GgmlType::F32),
            "implement",
        );
        bad(
            &d,
            Problem::matmul(1, 8, 64, GgmlType::Q8_0),
            "runs on moe shapes",
        );
    }

    /// ALGO 1 asks for the Q8_1 activations in dynamic shared memory (x of
    /// every token for GATE_UP, h of every pair for DOWN), is the approx
    /// contract, and refuses the weights its dp4a products cannot read and
    /// activations beyond the device's shared memory.
    #[test]
    fn dp4a_points_size_their_shared_memory_and_refuse_what_they_cannot_read() {
        let f = MoeGemv;
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = with(&f.default_defines(GgmlType::Q8_0), &[("ALGO", 1i64.into())]);
        assert_eq!(f.contract(&d), Contract::Approx);
        assert_eq!(f.contract(&f.default_defines(GgmlType::Q8_0)), Contract::Fp);
        let p = prob(8, 128, 8, 2816, 704, GgmlType::Q8_0);
        let g = f.validate(&d, &p, &lim).expect("gate_up");
        assert_eq!(g.dyn_smem, 8 * 2816 + 8 * 2816 / 32 * 8);
        let down = with(&d, &[("STAGE", "DOWN".into())]);
        let g = f.validate(&down, &p, &lim).expect("down");
        assert_eq!(g.dyn_smem, 8 * 8 * 704 * 5 / 4);
        let g = f
            .validate(&down, &prob(1, 128, 8, 2816, 704, GgmlType::Q8_0), &lim)
            .expect("down, one token");
        assert_eq!(g.dyn_smem, 8 * 704 * 5 / 4);
        // The FMA form takes none.
        let fma = f.default_defines(GgmlType::Q8_0);
        assert_eq!(f.validate(&fma, &p, &lim).expect("fma").dyn_smem, 0);
        let tol = f.default_tolerance(&down, &p);
        assert_eq!(tol.rms_rel, 1e-2);
        assert!(tol.replay_rms_rel < 1e-4, "{tol:?}");
        assert!(f.default_tolerance(&d, &p).rms_rel > tol.rms_rel);
        let bad = |d: &Defines, p: Problem, want: &str| {
            let e = f.validate(d, &p, &lim).expect_err(want);
            assert!(e.contains(want), "{e}");
        };
        let f16 = with(&f.default_defines(GgmlType::F16), &[("ALGO", 1i64.into())]);
        bad(&f16, prob(3, 6, 3, 264, 40, GgmlType::F16), "not F16");
        let q6 = with(
            &f.default_defines(GgmlType::Q6K),
            &[("ALGO", 1i64.into()), ("LAYOUT", 0i64.into())],
        );
        bad(&q6, prob(1, 8, 2, 512, 256, GgmlType::Q6K), "LAYOUT=0");
        bad(&with(&d, &[("ALGO", 3i64.into())]), p, "ALGO=3");
        // ALGO 2: an 80-byte split record per 32 values, the approx
        // contract at the split's bound.
        let split = with(&down, &[("ALGO", 2i64.into())]);
        assert_eq!(f.contract(&split), Contract::Approx);
        let g = f.validate(&split, &p, &lim).expect("down, split");
        assert_eq!(g.dyn_smem, 8 * 8 * 704 / 32 * 80);
        assert_eq!(f.default_tolerance(&split, &p).rms_rel, 1e-4);
        // sm_89's 99 KB hold no 8-token DOWN split of 26B-A4B (110 KB).
        let e = f
            .validate(&split, &p, &DeviceLimits::for_arch(Arch(89)))
            .expect_err("sm_89");
        assert!(e.contains("ALGO=2 at 8 tokens"), "{e}");
        // 8 tokens x 8 experts of a wide expert FFN: h does not fit.
        bad(
            &down,
            prob(8, 128, 8, 2816, 4096, GgmlType::Q8_0),
            "exceed the device's",
        );
    }

    /// ALGO 1's replay is each pair's dense Q8_1 replay
    /// (`matmul_q8_replay`, the dense dp4a GEMV's) on the chosen expert's
    /// rows: GATE_UP through gelu(g) * u, DOWN weighted and summed.
    #[test]
    fn q8_1_replay_is_the_dense_replay_per_pair() {
        let p = MoeProblem {
            tokens: 2,
            d_model: 64,
            ffn: 32,
            experts: 4,
            used: 2,
            wtype: GgmlType::Q8_0,
        };
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * (1.0 + b.abs());
        let gu = moe_inputs(&p, Stage::GateUp, WType::Q8_0, 3).expect("gate_up inputs");
        let got = replay_q8_1(&p, Stage::GateUp, &gu);
        let exact = reference(&p, Stage::GateUp, &gu);
        let (q, ds) = q8_1_replay(&gu.act);
        for pair in 0..p.tokens * p.used {
            let t = pair / p.used;
            let w = &gu.tensor.deq[&(gu.ids[pair] as usize)];
            let x = |v: &[i8]| v[t * 64..(t + 1) * 64].to_vec();
            let rows = matmul_q8_replay(w, &x(&q), &ds[t * 2..(t + 1) * 2], 1, 64, 64);
            for r in 0..32 {
                let want = gelu_tanh_f64(rows[r]) * rows[32 + r];
                assert!(close(got[pair * 32 + r], want), "{pair} {r}");
            }
        }
        assert_ne!(got, exact, "the replay is on the quantized activations");
        // ALGO 2: the same stage on the split records' values, far closer
        // to the exact activations than Q8_1.
        let split = replay_split(&p, Stage::GateUp, &gu);
        let err = |a: &[f64]| -> f64 {
            a.iter()
                .zip(&exact)
                .map(|(x, y)| (x - y).powi(2))
                .sum::<f64>()
                .sqrt()
        };
        assert!(
            err(&split) > 0.0 && err(&split) < 1e-2 * err(&got),
            "{} {}",
            err(&split),
            err(&got)
        );
        let dn = moe_inputs(&p, Stage::Down, WType::Q8_0, 3).expect("down inputs");
        let got = replay_q8_1(&p, Stage::Down, &dn);
        let (q, ds) = q8_1_replay(&dn.act);
        for t in 0..p.tokens {
            let mut want = [0f64; 64];
            for j in 0..p.used {
                let pair = t * p.used + j;
                let w = &dn.tensor.deq[&(dn.ids[pair] as usize)];
                let rows = matmul_q8_replay(
                    w,
                    &q[pair * 32..(pair + 1) * 32],
                    &ds[pair..pair + 1],
                    1,
                    64,
                    32,
                );
                for (o, v) in want.iter_mut().zip(rows) {
                    *o += dn.weights[pair] as f64 * v;
                }
            }
            for r in 0..64 {
                assert!(close(got[t * 64 + r], want[r]), "{t} {r}");
            }
        }
    }

    #[test]
    fn routing_is_distinct_per_token_and_grouping_keeps_first_appearance() {
        let p = MoeProblem {
            tokens: 8,
            d_model: 64,
            ffn: 32,
            experts: 8,
            used: 3,
            wtype: GgmlType::Q8_0,
        };
        let mut rng = rng_for("moe-routing-test", &[1], 1);
        let (ids, w) = check_routing(&mut rng, &p);
        for t in 0..8 {
            let row = &ids[3 * t..3 * t + 3];
            assert!(row.iter().all(|&e| (0..8).contains(&e)));
            assert!(
                row[0] != row[1] && row[1] != row[2] && row[0] != row[2],
                "{row:?}"
            );
            let s: f32 = w[3 * t..3 * t + 3].iter().sum();
            assert!((s - 1.0).abs() < 1e-5);
        }
        // 24 draws from 8 experts: tokens share.
        let u = distinct_experts(&ids);
        assert!(u.len() <= 8 && u.len() < ids.len());
        assert_eq!(distinct_experts(&[5, 2, 5, 7, 2, -1, 0]), vec![5, 2, 7, 0]);
    }

    /// The assembled tensor holds each chosen expert's own rows at its
    /// offset in every buffer, and the decoy everywhere else; the exact
    /// values are those rows' dequantization.
    #[test]
    fn expert_tensor_places_chosen_experts_and_the_decoy() {
        for wt in [WType::Q8_0, WType::Q4_0, WType::Q4K] {
            let (experts, rows, k) = (5usize, 3usize, 256usize);
            let t = expert_tensor("moe-tensor-test", &[1], wt, experts, rows, k, &[3, 1], 9)
                .expect("tensor");
            let rb = wt.row_bytes(k) * rows;
            let g = |e: usize| &t.all.gguf[e * rb..(e + 1) * rb];
            assert_ne!(g(3), g(1));
            assert_eq!(g(0), g(2));
            assert_eq!(g(0), g(4));
            assert_ne!(g(0), g(3));
            assert_eq!(t.deq.len(), 2);
            for e in [1usize, 3] {
                let mut v = vec![0f32; rows * k];
                crate::quant::dequantize_row(wt.ggml(), g(e), &mut v).expect("deq");
                assert_eq!(v, t.deq[&e]);
            }
            let qb = t.all.qplane.len() / experts;
            assert_eq!(qb * experts, t.all.qplane.len());
            assert_ne!(&t.all.qplane[qb..2 * qb], &t.all.qplane[..qb]);
            assert_eq!(&t.all.qplane[2 * qb..3 * qb], &t.all.qplane[..qb]);
        }
    }

    #[test]
    fn count_mismatch_names_the_expert() {
        assert_eq!(count_mismatch(&[0, 10, 0], &[0, 10, 0]), None);
        let m = count_mismatch(&[0, 20, 0], &[0, 10, 0]).expect("double read");
        assert!(m.contains("expert 1: 20 bytes read, 10 expected"), "{m}");
        let m = count_mismatch(&[5, 10, 0], &[0, 10, 0]).expect("unchosen read");
        assert!(m.contains("expert 0: 5 bytes read, 0 expected"), "{m}");
    }

    /// The references of both stages agree with `oracle::moe_ffn` run on
    /// the same dequantized experts (GATE_UP's h fed to DOWN).
    #[test]
    fn stage_references_compose_to_the_oracle() {
        let p = MoeProblem {
            tokens: 3,
            d_model: 64,
            ffn: 32,
            experts: 4,
            used: 2,
            wtype: GgmlType::Q8_0,
        };
        let gu = moe_inputs(&p, Stage::GateUp, WType::Q8_0, 5).expect("gate_up inputs");
        let h = reference(&p, Stage::GateUp, &gu);
        // DOWN on GATE_UP's h, with GATE_UP's routing and its own weights
        // for the same experts.
        let mut dn = moe_inputs(&p, Stage::Down, WType::Q8_0, 5).expect("down inputs");
        dn.ids = gu.ids.clone();
        dn.weights = gu.weights.clone();
        dn.act = h.iter().map(|&v| v as f32).collect();
        let chosen = distinct_experts(&dn.ids);
        dn.tensor = expert_tensor("moe-compose", &[2], WType::Q8_0, 4, 64, 32, &chosen, 5)
            .expect("down tensor");
        let y = reference(&p, Stage::Down, &dn);
        // The oracle on full dequantized tensors (decoy rows where unchosen).
        let full = |t: &ExpertTensor, rows: usize, k: usize| -> Vec<f32> {
            (0..4)
                .flat_map(|e| {
                    t.deq
                        .get(&e)
                        .cloned()
                        .unwrap_or_else(|| vec![0f32; rows * k])
                })
                .collect()
        };
        let ids: Vec<usize> = gu.ids.iter().map(|&e| e as usize).collect();
        let mut out = vec![0f32; 3 * 64];
        crate::oracle::moe_ffn(
            &gu.act,
            &full(&gu.tensor, 64, 64),
            &full(&dn.tensor, 64, 32),
            &ids,
            &gu.weights,
            3,
            64,
            32,
            2,
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
