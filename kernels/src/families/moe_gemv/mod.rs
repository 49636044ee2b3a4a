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
//! the kernel must match tightly. `H_RECORDS=1` has GATE_UP write h as
//! those split records (`families::q8_split_records`' format), and DOWN's
//! `ALGO=3` reads them: its check uploads the records of the random h, and
//! GATE_UP's check reads the records back as their values, against the
//! reference and the replay split by the same rule.
//!
//! The parts: `reference` (the check's routing, inputs, reference and
//! replays), `workload` (a stage launched and judged); this file holds the
//! family: stages, validation, launch geometry, tolerances.

use super::gemv::{dp4a_tolerance, fp_rms_bound, ActNoise, SPLIT_OUT_RMS};
use super::memo;
use crate::bind::moe::expert_binding;
use crate::bind::ActFormat;
use crate::defines::{defines, get_str, int_in, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{check_wtype, moe_of, MatmulProblem, MoeProblem, Problem, ProblemKind, WType};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::{WeightSet, Workload};

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

/// Whether GATE_UP writes h as split Q8 records (`H_RECORDS=1`; absent in
/// tables written before the define: f32).
pub fn h_records(d: &Defines) -> bool {
    matches!(d.get("H_RECORDS"), Some(DefineValue::Int(1)))
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
/// ALGO 2 an 80-byte split record per 32; ALGO 0 and 3 none.
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
/// DOWN's split-K slices (or, as large, GATE_UP's values of h before they
/// leave as records).
fn static_smem_bound(tokens: usize, warps: usize, rows: usize) -> usize {
    let np = tokens * MAX_USED;
    4 + np * (4 + 4 + 2 * tokens + tokens) + np * (4 + 2) + warps * rows * tokens * 4 + 64
}

mod reference;
#[cfg(test)]
mod tests;
mod workload;

pub use reference::distinct_experts;
pub(crate) use reference::{expert_tensor, ExpertTensor};
use reference::{moe_inputs, reference, replay_q8_1, replay_split};
use workload::MoeGemvWorkload;

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
        d.insert("H_RECORDS".into(), DefineValue::Int(0));
        d.insert("MINB".into(), DefineValue::Int(1));
        d.insert("HOIST".into(), DefineValue::Int(0));
        d.insert("PRELOAD".into(), DefineValue::Int(0));
        d.insert("STAGE".into(), DefineValue::Str("GATE_UP".into()));
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match d.get("ALGO") {
            Some(DefineValue::Int(1..=3)) => Contract::Approx,
            _ if h_records(d) => Contract::Approx,
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
        // h written as split records adds their rounding, as the dense
        // GEMV's OUT=Q8_SPLIT does.
        let fp = fp_rms_bound(k) + if h_records(d) { SPLIT_OUT_RMS } else { 0.0 };
        // As the dense dp4a GEMV's: GATE_UP's gelu(g) * u is its fused form.
        let gelu = matches!(stage, Ok(Stage::GateUp));
        match (self.contract(d), d.get("ALGO")) {
            (Contract::Approx, Some(DefineValue::Int(1))) => {
                dp4a_tolerance(ActNoise::Q8_1, gelu, fp)
            }
            (Contract::Approx, _) => dp4a_tolerance(ActNoise::Split, gelu, fp),
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
        let algo = int_in(d, "ALGO", &[0, 1, 2, 3])?;
        let layout = int_in(d, "LAYOUT", &[0, 1])?;
        if algo != 0 && (wt.is_16bit() || (wt == WType::Q6K && layout == 0)) {
            return Err(format!(
                "ALGO={algo} (dp4a) reads Q8_0 / Q4_0 weights or k-quant planes, not {} on LAYOUT={layout}",
                wt.define()
            ));
        }
        if algo == 3 && (stage != Stage::Down || layout != 1) {
            return Err(format!(
                "ALGO=3 reads the split records of h that GATE_UP writes (H_RECORDS=1): STAGE=DOWN on planes (LAYOUT=1), not {stage:?} on LAYOUT={layout}"
            ));
        }
        let records = int_in(d, "H_RECORDS", &[0, 1])? == 1;
        if records {
            if stage != Stage::GateUp {
                return Err(
                    "H_RECORDS=1 is GATE_UP's output format (DOWN reads the records with ALGO=3)"
                        .into(),
                );
            }
            if (warps * rows) % 32 != 0 {
                return Err(format!(
                    "H_RECORDS=1 writes whole 32-row records per block: WARPS * ROWS = {} is not a multiple of 32",
                    warps * rows
                ));
            }
        }
        // The one-token entry's __launch_bounds__ minimum of blocks per SM
        // (a register cap); the multi-token entries ask one whatever MINB.
        int_in(d, "MINB", &[1, 2, 3, 4]).map_err(|e| {
            format!("{e}: MINB is the blocks per SM the one-token entry asks of the compiler")
        })?;
        let hoist = int_in(d, "HOIST", &[0, 1])?;
        if hoist == 1 && algo != 1 && algo != 2 {
            return Err(format!(
                "HOIST=1 overlaps the block's quantization of the activations with its first weight loads: ALGO=1 or 2, not ALGO={algo} (which quantizes nothing)"
            ));
        }
        // Work before the chained launch's wait on what earlier grids wrote
        // (moe_gemv.cu, Prologue): the launch and the sums are the same. It
        // may be absent (tables written before it: 0, as the planner fills in).
        let preload = if d.contains_key("PRELOAD") {
            int_in(d, "PRELOAD", &[0, 1, 2]).map_err(|e| {
                format!("{e}: PRELOAD=1 groups the experts and issues DOWN's first loads, or quantizes GATE_UP's x, before the launch's wait; PRELOAD=2 runs GATE_UP's whole HOIST prologue before it")
            })?
        } else {
            0
        };
        if preload == 1 && stage == Stage::GateUp && (hoist == 1 || (algo != 1 && algo != 2)) {
            return Err(format!(
                "GATE_UP's PRELOAD=1 quantizes x before the launch's wait: ALGO=1 or 2 with HOIST=0 (HOIST's first loads need the ids the predecessor writes), not ALGO={algo}, HOIST={hoist}"
            ));
        }
        // PRELOAD=2 also reads the ids before the wait: the engine binds it
        // only where the router runs before the shared MLP (a grid between).
        if preload == 2 && (stage != Stage::GateUp || hoist != 1) {
            return Err(format!(
                "PRELOAD=2 is GATE_UP's HOIST order (grouping, first units, x) before the launch's wait: STAGE=GATE_UP with HOIST=1 (ALGO 1 or 2), not STAGE={} with HOIST={hoist}",
                if stage == Stage::GateUp { "GATE_UP" } else { "DOWN" }
            ));
        }
        if (records || algo == 3) && mp.ffn % 32 != 0 {
            return Err(format!(
                "ffn={} is not a multiple of 32: split records hold 32 values of h each",
                mp.ffn
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
        let algo = int_in(d, "ALGO", &[0, 1, 2, 3]).map_err(GpuError::Rejected)?;
        let records = h_records(d);
        // ALGO 3 reads h as the split records GATE_UP would have written
        // from these values; everything else reads the f32 activations.
        let (act, act_bytes) = if algo == 3 {
            let rec = super::q8_split_records(&inp.act);
            (gpu.upload(&rec)?, rec.len())
        } else {
            (gpu.upload(&inp.act)?, inp.act.len() * 4)
        };
        let ids = gpu.upload(&inp.ids)?;
        let weights = gpu.upload(&inp.weights)?;
        let out_len = match stage {
            Stage::GateUp => mp.tokens * mp.used * mp.ffn,
            Stage::Down => mp.tokens * mp.d_model,
        };
        let out = gpu.alloc(out_len * 4)?;
        let count = gpu.alloc(mp.experts * 8)?;
        let active: u64 = expected.iter().sum();
        let h_format = if records {
            ActFormat::Q8Split
        } else {
            ActFormat::F32
        };
        let out_bytes = h_format.bytes(1, out_len) as u64;
        let bytes = active + act_bytes as u64 + out_bytes;
        let ops = 2 * (mp.tokens * mp.used * rows * k) as u64;
        let key = format!("moe_gemv ref {mp:?} {stage:?} {seed}");
        let inp2 = inp.clone();
        let reference: super::RefFn = Box::new(move || {
            let r = memo::get(key.clone(), || reference(&mp, stage, &inp2));
            let replay = match algo {
                1 => Some(memo::get(format!("{key} replay q8_1"), || {
                    replay_q8_1(&mp, stage, &inp2)
                })),
                2 | 3 => Some(memo::get(format!("{key} replay split"), || {
                    replay_split(&mp, stage, &inp2)
                })),
                _ => None,
            };
            // Records of h: the replay's values (the reference's, on the
            // exact path) split by the kernel's rule.
            let replay = match (records, replay) {
                (true, rp) => Some(super::split_output_replay(rp.as_deref().unwrap_or(&r))),
                (false, rp) => rp.map(|rp| (*rp).clone()),
            };
            ((*r).clone(), replay)
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
            h_records: records,
            p: mp,
            geo: geo.clone(),
            reference,
            bytes,
            ops,
        }))
    }
}
