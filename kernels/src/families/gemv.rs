//! `gemv`: decode matmul (1..8 tokens) over every matmul weight type, with
//! f32 activations (optionally staged in padded shared memory, XSMEM=1),
//! Q8_1 activations (dp4a), or split Q8 activations that each block makes
//! from the f32 rows (ALGO 2, k-quant planes) or reads as records a
//! producer wrote (ALGO 3, the planes of Q8_0, Q4_0 and the k-quants);
//! optional gate+up+GELU fusion (FUSE=1) or GELU times a given operand
//! (FUSE=2, the PLE gate); optional sandwich-norm step over the output in
//! the grid's last block (TAIL=1: the residual add and the next
//! projection's input norm, so no norm launch follows a decode
//! projection). See kernels/cuda/gemv.cu and sandwich_tail.cuh.

use super::gemv_tail::{tail_bytes, tail_operands, with_tail_reference};
use super::rows_common::format_tolerance;
use super::{
    ds_words, gelu_tanh_f64, matmul_f64, matmul_f64_x, matmul_q8_replay, memo, q8_1_replay,
    q8_split_records, seeded_inputs, split_output_replay, split_q8_replay, MatmulWorkload,
    QWeights,
};
use crate::bind::matmul::{gemv_out, gemv_tail, MatmulBinding, TailMode};
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

/// The quantized activations of a dp4a GEMV (dense or expert).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ActNoise {
    /// Q8_1: 8 bits per value.
    Q8_1,
    /// Split Q8 records: about 15 bits per value.
    Split,
}

/// The approx contract's bounds of a GEMV over quantized activations;
/// `gelu` when the output is gelu(g) * u, `fp` the replay's bound.
/// Q8_1 rounding of uniform activations is ~0.4 % RMS per dot product,
/// independent of k; the split's residual about 1e-5 of the activations'
/// RMS per value (scale under amax / 127 / 254). gelu(g) * u combines two
/// such errors and gelu's slope near 0 amplifies them, so its bounds are
/// three times looser (Q8_1 also in max_rel).
pub(crate) fn dp4a_tolerance(noise: ActNoise, gelu: bool, fp: f64) -> Tolerance {
    let (rms_rel, max_rel) = match (noise, gelu) {
        (ActNoise::Split, false) => (1e-4, 2e-3),
        (ActNoise::Split, true) => (3e-4, 6e-3),
        (ActNoise::Q8_1, false) => (1e-2, 5e-2),
        (ActNoise::Q8_1, true) => (3e-2, 0.15),
    };
    Tolerance {
        rms_rel,
        max_rel,
        outlier_frac: 1e-3,
        replay_rms_rel: fp,
    }
}

/// What writing outputs as split records (gemv OUT=Q8_SPLIT, moe_gemv
/// H_RECORDS=1) adds to the replay bound: the split rounds each value to
/// about amax / 2^15 of its 32-value group; the replay splits its own
/// outputs by the same rule, but an output a few ulps from a rounding
/// boundary may round the other way there.
pub(crate) const SPLIT_OUT_RMS: f64 = 5e-5;

/// Tolerance of an f32-accumulated dot product of length k: a few times the
/// random-walk growth of f32 rounding (sqrt(k) * 2^-24), plus a floor.
pub(crate) fn fp_rms_bound(k: usize) -> f64 {
    4.0 * (k as f64).sqrt() * f64::powi(2.0, -24) + 1e-6
}

/// Dynamic shared memory of the XSMEM=1 form at `m` tokens: the f32 rows
/// with 4 floats of padding after every 32-element group (gemv.cu).
fn xsmem_bytes(algo: i64, m: usize, k: usize, lim: &DeviceLimits) -> Result<u32, String> {
    if algo != 0 {
        return Err("XSMEM=1 stages f32 activations: it needs ALGO=0".into());
    }
    if k % 32 != 0 {
        return Err(format!(
            "k={k} is not a multiple of 32: XSMEM=1 pads the staged rows per 32-element group"
        ));
    }
    let bytes = m * (k / 32) * 36 * 4;
    staged_bytes(bytes, lim).map_err(|room| {
        format!(
            "XSMEM=1 stages {bytes} bytes of activations ({m} x {k} f32 and padding), over the {room} a block may use here ({}); XSMEM=0 reads them from global memory",
            lim.arch
        )
    })
}

/// Whether the variant writes its output as split Q8 records (OUT=Q8_SPLIT).
fn split_out(d: &Defines) -> bool {
    gemv_out(d) == Ok(ActFormat::Q8Split)
}

/// Whether the variant's tail writes a quantized output (TAIL_OUT = Q8_1
/// or Q8_SPLIT).
fn tail_quantizes(d: &Defines) -> bool {
    matches!(
        gemv_tail(d),
        Ok(TailMode::Norm(ActFormat::Q8_1 | ActFormat::Q8Split))
    )
}

/// The looser of two tolerances, bound by bound: a comparison over outputs
/// judged by either.
fn loosest(a: Tolerance, b: Tolerance) -> Tolerance {
    Tolerance {
        rms_rel: a.rms_rel.max(b.rms_rel),
        max_rel: a.max_rel.max(b.max_rel),
        outlier_frac: a.outlier_frac.max(b.outlier_frac),
        replay_rms_rel: a.replay_rms_rel.max(b.replay_rms_rel),
    }
}

/// Dynamic shared memory of ALGO 2 at `m` tokens: one 80-byte split
/// record (`XSplit` in gemv_chunk.cuh) per 32-element group and token.
fn split_bytes(m: usize, k: usize, lim: &DeviceLimits) -> Result<u32, String> {
    let bytes = m * (k / 32) * SPLIT_RECORD;
    staged_bytes(bytes, lim).map_err(|room| {
        format!(
            "ALGO=2 stages {bytes} bytes of split activations ({m} x {k}), over the {room} a block may use here ({})",
            lim.arch
        )
    })
}

/// `bytes` of activations staged per block, when they fit beside the
/// KSPLIT reduction's static partial sums (at most 32 warps x 2 x 8 x 8
/// floats); else the room there is, for the caller's message.
fn staged_bytes(bytes: usize, lim: &DeviceLimits) -> Result<u32, usize> {
    let room = (lim.max_smem_per_block as usize).saturating_sub(16 << 10);
    if bytes > room {
        return Err(room);
    }
    Ok(bytes as u32)
}

/// Bytes of one group's split activations in shared memory (gemv ALGO 2).
const SPLIT_RECORD: usize = 80;

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
        // Q6_K: f32 activations over the GGUF super-blocks (the tied head
        // as the file stores it); F16/BF16: f32 activations (there is no
        // dp4a path); the others dp4a over planes.
        let (algo, layout) = match WType::of(wtype) {
            Some(WType::Q6K) => (0, 0),
            Some(WType::F16 | WType::Bf16) => (0, 1),
            _ => (1, 1),
        };
        let mut d = defines([
            ("ALGO", algo),
            ("LAYOUT", layout),
            ("ROWS", 2),
            ("WARPS", 4),
            ("FUSE", 0),
            ("KSPLIT", 1),
            ("UNROLL", 1),
            ("XSMEM", 0),
        ]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d.insert("OUT".into(), DefineValue::Str("F32".into()));
        d.insert("TAIL".into(), DefineValue::Int(0));
        d.insert("TAIL_OUT".into(), DefineValue::Str("NONE".into()));
        d.insert("PRELOAD".into(), DefineValue::Int(0));
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        match d.get("ALGO") {
            Some(DefineValue::Int(1..=3)) => Contract::Approx,
            _ if split_out(d) || tail_quantizes(d) => Contract::Approx,
            _ => Contract::Fp,
        }
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        let (n, k) = matmul_of(p).map(|m| (m.n, m.k)).unwrap_or((32, 32));
        let fp = fp_rms_bound(k) + if split_out(d) { SPLIT_OUT_RMS } else { 0.0 };
        // FUSE=1 and 2 end in gelu_tanh, which amplifies the activations'
        // noise where its slope exceeds one.
        let fused = matches!(d.get("FUSE"), Some(DefineValue::Int(1 | 2)));
        let gemv = match (self.contract(d), d.get("ALGO")) {
            (Contract::Approx, Some(DefineValue::Int(1))) => {
                dp4a_tolerance(ActNoise::Q8_1, fused, fp)
            }
            (Contract::Approx, Some(DefineValue::Int(2 | 3))) => {
                dp4a_tolerance(ActNoise::Split, fused, fp)
            }
            _ => Tolerance::fp(fp),
        };
        // The tail's outputs follow y in the comparison: the step's f32
        // sums over n values, then its output format's rounding.
        match gemv_tail(d) {
            Ok(TailMode::Residual) => loosest(gemv, Tolerance::fp(fp_rms_bound(n))),
            Ok(TailMode::Norm(f)) => loosest(gemv, format_tolerance(f, fp_rms_bound(n))),
            _ => gemv,
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
        let algo = int_in(d, "ALGO", &[0, 1, 2, 3])?;
        let layout = int_in(d, "LAYOUT", &[0, 1])?;
        let fuse = int_in(d, "FUSE", &[0, 1, 2])?;
        match wt {
            WType::Q6K if layout == 0 => {
                // The GGUF super-blocks are read in one form only.
                if algo != 0 {
                    return Err(
                        "Q6_K weights need ALGO=0 (f32 activations) on GGUF super-blocks (LAYOUT=0); dp4a reads the planes (LAYOUT=1)"
                            .into(),
                    );
                }
                if fuse != 0 {
                    return Err(
                        "Q6_K weights need FUSE=0 on GGUF super-blocks (LAYOUT=0); the fused form reads planes (LAYOUT=1)"
                            .into(),
                    );
                }
            }
            WType::Q4K | WType::Q5K if layout != 1 => {
                return Err(format!(
                    "{} weights need LAYOUT=1: the kernel reads their nibble plane and side records (quant::repack)",
                    wt.define()
                ));
            }
            WType::F16 | WType::Bf16 => {
                if algo != 0 {
                    return Err(format!(
                        "{} weights need ALGO=0 (f32 activations): there is no dp4a path over 16-bit values",
                        wt.define()
                    ));
                }
                if mp.k % 8 != 0 {
                    return Err(format!(
                        "k={} is not a multiple of 8: {} rows are read in 16-byte pieces",
                        mp.k,
                        wt.define()
                    ));
                }
            }
            _ => {}
        }
        if algo == 2 && !(matches!(wt, WType::Q4K | WType::Q5K | WType::Q6K) && layout == 1) {
            return Err(format!(
                "ALGO=2 (split Q8 activations made per block) reads k-quant planes (Q4_K, Q5_K, Q6_K with LAYOUT=1), not {} with LAYOUT={layout}",
                wt.define()
            ));
        }
        if algo == 3
            && !(matches!(
                wt,
                WType::Q8_0 | WType::Q4_0 | WType::Q4K | WType::Q5K | WType::Q6K
            ) && layout == 1)
        {
            return Err(format!(
                "ALGO=3 (split Q8 records) reads planes (LAYOUT=1) of Q8_0, Q4_0 or a k-quant, not {} with LAYOUT={layout}",
                wt.define()
            ));
        }
        let rows = int_range(d, "ROWS", 1, 8)?;
        let warps = int_range(d, "WARPS", 1, 32)?;
        let ksplit = int_in(d, "KSPLIT", &[1, 2, 4, 8])?;
        let unroll = int_in(d, "UNROLL", &[1, 2, 4])?;
        let kquant = matches!(wt, WType::Q4K | WType::Q5K | WType::Q6K);
        // FUSE=1 streams two matrices; FUSE=2 one (its side operand is
        // read once per output).
        let chunks = (1 + i64::from(fuse == 1)) * rows * unroll;
        // Nibble chunks unpack into twice their words; Q8_0's do not.
        let nibbles = kquant || wt == WType::Q4_0;
        let most = match (fuse == 1, kquant) {
            (true, _) if nibbles => 4,
            (false, true) => 15,
            _ => i64::MAX,
        };
        if (algo == 1 || algo == 3) && chunks > most {
            // A k-quant chunk keeps 6 (Q4_K), 7 (Q5_K) or 8 (Q6_K) words
            // live (nibbles, two scales, high-bit words): 16 chunks in
            // flight next to 8 x 8 accumulators pass the 255 registers.
            // Two matrices of 4 rows next to 2 x 4 x 8 accumulators do
            // too with any nibble type (Q6_K spills on sm_80 under NVRTC
            // 13.0, Q4_0 on sm_80 and sm_90 under 13.5); Q8_0 does not.
            return Err(format!(
                "{} on dp4a with {} chunks in flight (matrices x ROWS x UNROLL) reaches the 255-register ceiling (ptxas spills on sm_80, sm_89 or sm_90); at most {most}{}",
                wt.define(),
                chunks,
                if fuse == 1 { " with FUSE=1" } else { "" }
            ));
        }
        if warps % ksplit != 0 {
            return Err(format!("KSPLIT={ksplit} does not divide WARPS={warps}"));
        }
        if gemv_out(d)? == ActFormat::Q8Split {
            let block_rows = warps / ksplit * rows;
            if block_rows % 32 != 0 {
                return Err(format!(
                    "OUT=Q8_SPLIT writes whole 32-row records per block: (WARPS / KSPLIT) * ROWS = {block_rows} is not a multiple of 32"
                ));
            }
            if mp.n % 32 != 0 {
                return Err(format!(
                    "OUT=Q8_SPLIT needs n a multiple of 32 (one record per 32 outputs), not n={}",
                    mp.n
                ));
            }
        }
        // TAIL may be absent (tables written before it: no tail).
        if d.contains_key("TAIL") {
            int_in(d, "TAIL", &[0, 1])?;
        }
        match gemv_tail(d)? {
            TailMode::None => {}
            tail => {
                if gemv_out(d)? != ActFormat::F32 || fuse != 0 {
                    return Err(
                        "TAIL=1 reads y back as the f32 rows of the plain product: it needs OUT=F32 and FUSE=0"
                            .into(),
                    );
                }
                let quantized =
                    matches!(tail, TailMode::Norm(ActFormat::Q8_1 | ActFormat::Q8Split));
                let unit = if quantized { 32 } else { 4 };
                if mp.n % unit != 0 {
                    return Err(format!(
                        "TAIL=1 reads the rows in 4-value pieces{}: n={} is not a multiple of {unit}",
                        if quantized {
                            " and writes its output in 32-value groups"
                        } else {
                            ""
                        },
                        mp.n
                    ));
                }
            }
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
        // Where a lane's first chunks are loaded (after or before the
        // chained launch's wait, 2: with the next ones prefetched into L2
        // as well): the launch and the sums are the same. It may be absent
        // (tuned tables written before it: 0, as the planner fills in).
        let preload = if d.contains_key("PRELOAD") {
            int_in(d, "PRELOAD", &[0, 1, 2]).map_err(|e| {
                format!("{e}: PRELOAD=1 loads a lane's first chunks before the launch's wait, 2 also prefetches the next ones")
            })?
        } else {
            0
        };
        if preload == 2 && layout == 0 && !matches!(wt, WType::F16 | WType::Bf16) {
            return Err(format!(
                "PRELOAD=2 prefetches 16-byte pieces of planes or 16-bit rows: {} on GGUF blocks (LAYOUT=0) needs PRELOAD 0 or 1",
                wt.define()
            ));
        }
        let xsmem = int_in(d, "XSMEM", &[0, 1])? == 1;
        let dyn_smem = if algo >= 2 {
            if xsmem {
                return Err(format!(
                    "ALGO={algo} reads split activations: XSMEM=1 applies to ALGO=0"
                ));
            }
            if algo == 2 {
                split_bytes(mp.m, mp.k, lim)?
            } else {
                0
            }
        } else if xsmem {
            xsmem_bytes(algo, mp.m, mp.k, lim)?
        } else {
            0
        };
        let per_block = (warps / ksplit * rows) as usize;
        Ok(LaunchGeometry {
            kernel: format!("gemv_n{}", mp.m),
            grid: (mp.n.div_ceil(per_block) as u32, 1, 1),
            block: (threads as u32, 1, 1),
            dyn_smem,
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
        let fuse_mode = crate::defines::get_int(d, "FUSE").map_err(GpuError::Rejected)?;
        let fuse = fuse_mode == 1;
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
        let binding = MatmulBinding::of(self.name(), d).map_err(GpuError::Rejected)?;
        let mut planes = Vec::new();
        for w in &mats {
            planes.extend(w.upload(gpu, wt, binding.layout)?);
        }
        let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
        let (q, ds) = q8_1_replay(x);
        let (acts, act_bytes) = match algo {
            1 => {
                let bytes = (q.len() + ds.len() * 8) as u64;
                (vec![gpu.upload(&q)?, gpu.upload(&ds_words(&ds))?], bytes)
            }
            // The producer's split records, as the pre-pass writes them.
            3 => {
                let rec = q8_split_records(x);
                let bytes = rec.len() as u64;
                (vec![gpu.upload(&rec)?], bytes)
            }
            _ => (vec![gpu.upload(x)?], (m * k * 4) as u64),
        };
        // FUSE=2: the f32 operand gelu(W x) is multiplied by, [m][n].
        let side: Option<Vec<f32>> = (fuse_mode == 2).then(|| {
            let mut rng = super::rng_for("gemv side", &[m, n], seed);
            super::random_matrix(&mut rng, m, n)
        });
        let key = format!("gemv {m} {n} {k} {wt:?} fuse={fuse_mode} {seed}");
        let inp = inputs.clone();
        let out_split = binding.out == ActFormat::Q8Split;
        let side_vals = side.clone();
        let reference: super::RefFn = Box::new(move || {
            let combine = |parts: &[Vec<f64>]| -> Vec<f64> {
                if fuse {
                    parts[0]
                        .iter()
                        .zip(&parts[1])
                        .map(|(g, u)| gelu_tanh_f64(*g) * u)
                        .collect()
                } else if let Some(s) = &side_vals {
                    parts[0]
                        .iter()
                        .zip(s)
                        .map(|(g, &u)| gelu_tanh_f64(*g) * u as f64)
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
            let replay = match algo {
                1 => Some(memo::get(format!("{key} replay q8_1"), || {
                    let rp: Vec<Vec<f64>> = inp
                        .w
                        .iter()
                        .map(|w| matmul_q8_replay(&w.deq, &q, &ds, m, n, k))
                        .collect();
                    combine(&rp)
                })),
                2 | 3 => Some(memo::get(format!("{key} replay split"), || {
                    let xs = split_q8_replay(&inp.x);
                    let rp: Vec<Vec<f64>> = inp
                        .w
                        .iter()
                        .map(|w| matmul_f64_x(&w.deq, &xs, m, n, k))
                        .collect();
                    combine(&rp)
                })),
                _ => None,
            }
            .map(|rp| {
                if out_split {
                    // The kernel splits its f32 outputs into records.
                    split_output_replay(&rp)
                } else {
                    (*rp).clone()
                }
            });
            ((*r).clone(), replay)
        });
        let tail_mode = binding.tail;
        let (reference, tail) = match tail_mode {
            TailMode::None => (reference, None),
            mode => {
                let format = match mode {
                    TailMode::Norm(f) => Some(f),
                    _ => None,
                };
                let (tail, vals) = tail_operands(gpu, m, n, geo.grid.0 as usize, format, seed)?;
                (
                    with_tail_reference(reference, vals, m, n, format),
                    Some(tail),
                )
            }
        };
        let y = gpu.alloc(m * n * 4)?;
        let side = side.map(|s| gpu.upload(&s)).transpose()?;
        let side_bytes = side.as_ref().map_or(0, |_| (m * n * 4) as u64);
        let act = match binding.act {
            ActFormat::F32 => Act::f32(acts[0].ptr()),
            format => Act {
                format,
                data: acts[0].ptr(),
                scales: acts.get(1).map_or(crate::bind::NULL, |b| b.ptr()),
            },
        };
        let nmat = mats.len() as u64;
        Ok(Box::new(MatmulWorkload {
            weights: WeightSet::new(planes),
            _acts: acts,
            act,
            y,
            side,
            tail,
            geo: geo.clone(),
            binding,
            m,
            n,
            k,
            reference,
            bytes: weight_bytes
                + act_bytes
                + side_bytes
                + binding.out.bytes(m, n) as u64
                + tail_bytes(tail_mode, m, n),
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
    use crate::bind::matmul::Prepass;
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
        for (name, v, why) in [("ALGO", 1i64, "ALGO=0"), ("FUSE", 1, "FUSE=0")] {
            let mut bad = d.clone();
            bad.insert(name.into(), DefineValue::Int(v));
            let e = f.validate(&bad, &p, &lim).expect_err(name);
            assert!(e.starts_with("Q6_K weights need") && e.contains(why), "{e}");
        }
        // On its planes Q6_K takes every algorithm and the fused form.
        let mut planes = d.clone();
        for (name, v) in [("LAYOUT", 1i64), ("ALGO", 1), ("FUSE", 1)] {
            planes.insert(name.into(), DefineValue::Int(v));
        }
        f.validate(&planes, &p, &lim)
            .expect("Q6_K planes, dp4a, fused");
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
    fn new_types_validate_where_their_kernels_exist() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let set = |d: &Defines, kv: &[(&str, i64)]| {
            let mut d = d.clone();
            for (k, v) in kv {
                d.insert((*k).into(), DefineValue::Int(*v));
            }
            d
        };
        for ty in [GgmlType::Q4K, GgmlType::Q5K] {
            let p = Problem::matmul(3, 1000, 2560, ty);
            let d = f.default_defines(ty);
            for algo in [0, 1] {
                for fuse in [0, 1] {
                    let v = set(&d, &[("ALGO", algo), ("FUSE", fuse)]);
                    f.validate(&v, &p, &lim)
                        .expect("planes this algorithm reads");
                }
            }
            let e = f
                .validate(&set(&d, &[("LAYOUT", 0)]), &p, &lim)
                .expect_err("no GGUF-block path");
            assert!(e.contains("need LAYOUT=1"), "{e}");
            let e = f
                .validate(&d, &Problem::matmul(1, 64, 2592, ty), &lim)
                .expect_err("partial super-block");
            assert!(e.contains("256-element"), "{e}");
            let b = MatmulBinding::of("gemv", &d).expect("bind");
            let wt = WType::of(ty).expect("wtype");
            let side = if ty == GgmlType::Q4K { 16 } else { 48 };
            assert_eq!(
                b.weight_bytes(wt, 1000, 2560),
                (1000 * 1280, 1000 * 10 * side)
            );
        }
        // dp4a keeps at most 8 k-quant chunks in flight per lane; the f32
        // path walks the segments of 5..8 tokens in a loop and takes any.
        for ty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
            let p = Problem::matmul(8, 1000, 2560, ty);
            let d = f.default_defines(ty);
            let wide = set(&d, &[("LAYOUT", 1), ("ROWS", 8), ("UNROLL", 2)]);
            let e = f
                .validate(&set(&wide, &[("ALGO", 1)]), &p, &lim)
                .expect_err("16 chunks in flight on dp4a");
            assert!(e.contains("with 16 chunks in flight"), "{e}");
            f.validate(&set(&wide, &[("ALGO", 1), ("UNROLL", 1)]), &p, &lim)
                .expect("8 chunks in flight on dp4a");
            // The fused form keeps both matrices' chunks.
            let fused = set(
                &wide,
                &[("ALGO", 1), ("UNROLL", 1), ("FUSE", 1), ("ROWS", 4)],
            );
            let e = f
                .validate(&fused, &p, &lim)
                .expect_err("8 chunks in flight, fused");
            assert!(e.contains("with 8 chunks in flight"), "{e}");
            f.validate(&set(&fused, &[("ROWS", 2)]), &p, &lim)
                .expect("4 chunks in flight, fused");
            f.validate(&set(&wide, &[("ALGO", 0)]), &p, &lim)
                .expect("the f32 path");
        }
        for ty in [GgmlType::F16, GgmlType::Bf16] {
            let d = f.default_defines(ty);
            assert_eq!(f.contract(&d), Contract::Fp);
            for layout in [0, 1] {
                let v = set(&d, &[("LAYOUT", layout)]);
                f.validate(&v, &Problem::matmul(8, 37, 2568, ty), &lim)
                    .expect("16-bit, k a multiple of 8");
                let b = MatmulBinding::of("gemv", &v).expect("bind");
                let wt = WType::of(ty).expect("wtype");
                assert_eq!(b.weight_bytes(wt, 37, 2568), (37 * 2568 * 2, 0));
            }
            let e = f
                .validate(
                    &set(&d, &[("ALGO", 1)]),
                    &Problem::matmul(1, 8, 256, ty),
                    &lim,
                )
                .expect_err("no dp4a");
            assert!(e.contains("need ALGO=0"), "{e}");
            let e = f
                .validate(&d, &Problem::matmul(1, 8, 260, ty), &lim)
                .expect_err("k % 8");
            assert!(e.contains("not a multiple of 8"), "{e}");
        }
    }

    /// The split of ALGO 2 carries each activation to within half a step
    /// of the residual's scale: |x - (d1 q1 + d2 q2)| <= d2 / 2 with
    /// d2 <= amax / 127 / 2 (+ rounding), i.e. about amax / 2^15.
    #[test]
    fn split_activations_carry_about_fifteen_bits() {
        let mut rng = super::super::rng_for("gemv-split", &[64], 3);
        let mut x = super::super::random_matrix(&mut rng, 4, 256);
        x[5] = 0.0;
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        let xs = crate::families::split_q8_replay(&x);
        for (g, (blk, hat)) in x.chunks(32).zip(xs.chunks(32)).enumerate() {
            let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
            for (&v, &h) in blk.iter().zip(hat) {
                let err = (v as f64 - h).abs();
                assert!(
                    err <= amax / 127.0 / 254.0 * 1.01 + 1e-30,
                    "group {g}: {v} -> {h}, error {err:e} over amax {amax:e}"
                );
            }
        }
        assert!(
            xs[32..64].iter().all(|&h| h == 0.0),
            "an all-zero group stays zero"
        );
    }

    /// ALGO 2 splits per block over k-quant planes only; ALGO 3 reads the
    /// producer's records over the planes of Q8_0, Q4_0 and the k-quants.
    /// Neither reads GGUF blocks or 16-bit weights.
    #[test]
    fn split_activations_read_the_planes_they_name() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let kq = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];
        let all = [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
        ];
        for (algo, smem, act, read) in [
            (2, 8 * 80 * 80, ActFormat::F32, &kq[..]),
            (3, 0, ActFormat::Q8Split, &all[..]),
        ] {
            for &ty in read {
                let mut d = f.default_defines(ty);
                d.insert("ALGO".into(), DefineValue::Int(algo));
                d.insert("LAYOUT".into(), DefineValue::Int(1));
                assert_eq!(f.contract(&d), Contract::Approx);
                let g = f
                    .validate(&d, &Problem::matmul(8, 100, 2560, ty), &lim)
                    .expect("planes this algorithm reads");
                // ALGO 2 splits the rows into shared memory itself; ALGO 3
                // reads the producer's records from global memory.
                assert_eq!(g.dyn_smem, smem, "ALGO={algo}");
                let b = MatmulBinding::of("gemv", &d).expect("bind");
                assert_eq!(b.act, act, "ALGO={algo}");
                let pre = if algo == 3 {
                    Prepass::QuantizeQ8_1
                } else {
                    Prepass::None
                };
                assert_eq!(b.prepass, pre, "ALGO={algo}");
                d.insert("XSMEM".into(), DefineValue::Int(1));
                let e = f
                    .validate(&d, &Problem::matmul(1, 100, 2560, ty), &lim)
                    .expect_err("XSMEM is ALGO 0's");
                assert!(e.contains("XSMEM=1 applies to ALGO=0"), "{e}");
            }
            let refused = all
                .iter()
                .filter(|t| !read.contains(t))
                .map(|&t| (t, 1))
                .chain([(GgmlType::F16, 1), (GgmlType::Bf16, 1)])
                .chain([(GgmlType::Q8_0, 0), (GgmlType::Q4_0, 0), (GgmlType::Q6K, 0)]);
            for (ty, layout) in refused {
                let mut d = f.default_defines(ty);
                d.insert("ALGO".into(), DefineValue::Int(algo));
                d.insert("LAYOUT".into(), DefineValue::Int(layout));
                let e = f
                    .validate(&d, &Problem::matmul(1, 100, 2560, ty), &lim)
                    .expect_err("not read by this algorithm");
                assert!(
                    e.contains("planes") || e.contains("need ALGO=0"),
                    "ALGO={algo} {ty:?} LAYOUT={layout}: {e}"
                );
            }
        }
    }

    /// OUT=Q8_SPLIT: whole 32-row records per block and n a multiple of
    /// 32; the binding writes records; the contract turns approx (the
    /// output's split) with its rounding in the bounds.
    #[test]
    fn split_output_needs_whole_records() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let mut d = f.default_defines(GgmlType::Q8_0);
        assert_eq!(d.get("OUT"), Some(&DefineValue::Str("F32".into())));
        for (k, v) in [
            ("ALGO", 3),
            ("FUSE", 1),
            ("ROWS", 4),
            ("WARPS", 8),
            ("KSPLIT", 1),
            ("UNROLL", 1),
        ] {
            d.insert(k.into(), DefineValue::Int(v));
        }
        d.insert("OUT".into(), DefineValue::Str("Q8_SPLIT".into()));
        let p = Problem::matmul(3, 10240, 2560, GgmlType::Q8_0);
        let g = f.validate(&d, &p, &lim).expect("32 rows a block");
        assert_eq!(g.grid.0, 10240 / 32);
        let b = MatmulBinding::of("gemv", &d).expect("bind");
        assert_eq!((b.out, b.matrices), (ActFormat::Q8Split, 2));
        let e = f
            .validate(&d, &Problem::matmul(3, 1000, 2560, GgmlType::Q8_0), &lim)
            .expect_err("n = 1000");
        assert!(e.contains("n a multiple of 32"), "{e}");
        let mut half = d.clone();
        half.insert("KSPLIT".into(), DefineValue::Int(2));
        let e = f.validate(&half, &p, &lim).expect_err("16 rows a block");
        assert!(e.contains("not a multiple of 32"), "{e}");
        let mut bad = d.clone();
        bad.insert("OUT".into(), DefineValue::Str("Q8_1".into()));
        assert!(f.validate(&bad, &p, &lim).is_err());
        assert!(MatmulBinding::of("gemv", &bad).is_err());
        // The FMA path with a split output is no longer fp.
        let mut fma = d.clone();
        fma.insert("ALGO".into(), DefineValue::Int(0));
        assert_eq!(f.contract(&fma), Contract::Approx);
        let t = f.default_tolerance(&fma, &p);
        assert!(t.replay_rms_rel > 5e-5 && t.rms_rel <= 3e-4, "{t:?}");
        fma.insert("OUT".into(), DefineValue::Str("F32".into()));
        assert_eq!(f.contract(&fma), Contract::Fp);
    }

    /// PRELOAD (the first chunks loaded before or after the launch's wait,
    /// the next ones prefetched too) changes neither the launch nor the
    /// contract on any weight type or algorithm; it takes 0, 1 or 2 (2 not
    /// on GGUF blocks, which it cannot prefetch), absent meaning 0.
    #[test]
    fn preload_keeps_the_launch_and_the_contract() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        for wt in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::F16,
        ] {
            let mut d = f.default_defines(wt);
            assert_eq!(d.get("PRELOAD"), Some(&DefineValue::Int(0)));
            if wt != GgmlType::F16 {
                d.insert("LAYOUT".into(), DefineValue::Int(1));
                d.insert("ALGO".into(), DefineValue::Int(3));
                d.insert("KSPLIT".into(), DefineValue::Int(2));
            }
            for m in [1, 8] {
                let p = Problem::matmul(m, 10240, 2560, wt);
                let g = f.validate(&d, &p, &lim).expect("PRELOAD=0");
                let mut pre = d.clone();
                pre.insert("PRELOAD".into(), DefineValue::Int(1));
                assert_eq!(f.validate(&pre, &p, &lim).expect("PRELOAD=1"), g);
                assert_eq!(f.contract(&pre), f.contract(&d));
                assert_eq!(f.default_tolerance(&pre, &p), f.default_tolerance(&d, &p));
                pre.insert("PRELOAD".into(), DefineValue::Int(2));
                assert_eq!(f.validate(&pre, &p, &lim).expect("PRELOAD=2"), g);
                assert_eq!(f.contract(&pre), f.contract(&d));
                pre.insert("PRELOAD".into(), DefineValue::Int(3));
                let e = f.validate(&pre, &p, &lim).expect_err("PRELOAD=3");
                assert!(e.contains("PRELOAD=3"), "{e}");
                // A tuned-table entry written before the define: PRELOAD=0.
                pre.remove("PRELOAD");
                assert_eq!(f.validate(&pre, &p, &lim).expect("no PRELOAD"), g);
            }
        }
        let mut blocks = f.default_defines(GgmlType::Q8_0);
        blocks.insert("LAYOUT".into(), DefineValue::Int(0));
        let p = Problem::matmul(1, 2560, 2560, GgmlType::Q8_0);
        blocks.insert("PRELOAD".into(), DefineValue::Int(1));
        f.validate(&blocks, &p, &lim)
            .expect("GGUF blocks, PRELOAD=1");
        blocks.insert("PRELOAD".into(), DefineValue::Int(2));
        let e = f.validate(&blocks, &p, &lim).expect_err("GGUF blocks");
        assert!(e.contains("LAYOUT=0"), "{e}");
    }

    /// TAIL=1 runs on the plain product written as f32 rows (FUSE=0,
    /// OUT=F32) and reads the rows in 4-value pieces (its Q8_1 / Q8_SPLIT
    /// output in 32-value groups); TAIL_OUT alone names nothing; a
    /// quantized TAIL_OUT makes the contract approx, and the tail's outputs
    /// loosen the tolerance to the output format's.
    #[test]
    fn the_tail_validates_where_it_reads_and_writes_whole_rows() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let mut d = f.default_defines(GgmlType::Q8_0);
        assert_eq!(d.get("TAIL"), Some(&DefineValue::Int(0)));
        assert_eq!(d.get("TAIL_OUT"), Some(&DefineValue::Str("NONE".into())));
        d.insert("ALGO".into(), DefineValue::Int(0));
        d.insert("TAIL".into(), DefineValue::Int(1));
        let p = Problem::matmul(3, 2560, 2048, GgmlType::Q8_0);
        let odd = Problem::matmul(3, 1000, 2048, GgmlType::Q8_0);
        f.validate(&d, &p, &lim).expect("the residual only");
        f.validate(&d, &odd, &lim)
            .expect("n = 1000: 4-value pieces");
        assert_eq!(f.contract(&d), Contract::Fp);
        // The least rms_rel each tail output's comparison allows: its
        // format's rounding over the step's f32 sums of n = 2560 squares.
        for (out, quantized, least) in [
            ("F32", false, fp_rms_bound(2560)),
            ("Q8_1", true, 1e-2),
            ("Q8_SPLIT", true, 1e-4),
        ] {
            let mut o = d.clone();
            o.insert("TAIL_OUT".into(), DefineValue::Str(out.into()));
            f.validate(&o, &p, &lim).expect(out);
            assert_eq!(f.validate(&o, &odd, &lim).is_err(), quantized, "{out}");
            let want = if quantized {
                Contract::Approx
            } else {
                Contract::Fp
            };
            assert_eq!(f.contract(&o), want, "{out}");
            let t = f.default_tolerance(&o, &p);
            assert!(t.rms_rel >= least, "{out}: {t:?}");
        }
        for (k, v) in [("FUSE", 1), ("FUSE", 2)] {
            let mut bad = d.clone();
            bad.insert(k.into(), DefineValue::Int(v));
            let e = f.validate(&bad, &p, &lim).expect_err("a fused GEMV");
            assert!(e.contains("FUSE=0"), "{e}");
        }
        let mut bad = d.clone();
        bad.insert("OUT".into(), DefineValue::Str("Q8_SPLIT".into()));
        bad.insert("ROWS".into(), DefineValue::Int(8));
        bad.insert("WARPS".into(), DefineValue::Int(4));
        let e = f.validate(&bad, &p, &lim).expect_err("records out");
        assert!(e.contains("OUT=F32"), "{e}");
        let mut orphan = f.default_defines(GgmlType::Q8_0);
        orphan.insert("TAIL_OUT".into(), DefineValue::Str("F32".into()));
        assert!(f.validate(&orphan, &p, &lim).is_err());
        let mut unknown = d.clone();
        unknown.insert("TAIL_OUT".into(), DefineValue::Str("DQ_F16".into()));
        assert!(f.validate(&unknown, &p, &lim).is_err());
        // A tuned-table entry written before the defines: no tail.
        let mut before = f.default_defines(GgmlType::Q8_0);
        before.remove("TAIL");
        before.remove("TAIL_OUT");
        f.validate(&before, &p, &lim)
            .expect("an entry without TAIL");
        let b = MatmulBinding::of("gemv", &before).expect("bind");
        assert_eq!(b.tail, TailMode::None);
    }

    /// ALGO 3's input buffer is the records the producers write: 80 bytes
    /// per group, the values the ALGO 2 replay uses, and the binding's
    /// activation size.
    #[test]
    fn split_records_are_what_the_split_replay_reads() {
        let mut rng = super::super::rng_for("gemv-split-records", &[3], 7);
        let x = super::super::random_matrix(&mut rng, 3, 96);
        let rec = q8_split_records(&x);
        assert_eq!(rec.len(), ActFormat::Q8Split.bytes(3, 96));
        assert_eq!(rec.len(), 9 * crate::families::Q8_SPLIT_RECORD);
        assert_eq!(
            crate::families::q8_split_values(&rec, x.len()),
            split_q8_replay(&x)
        );
        // Group 4: its sums are those of its quants.
        let g = &rec[4 * 80..5 * 80];
        let s1: i32 = g[..32].iter().map(|&b| b as i8 as i32).sum();
        let s2: i32 = g[32..64].iter().map(|&b| b as i8 as i32).sum();
        assert_eq!(i32::from_le_bytes([g[72], g[73], g[74], g[75]]), s1);
        assert_eq!(i32::from_le_bytes([g[76], g[77], g[78], g[79]]), s2);
    }

    #[test]
    fn staged_activations_size_their_shared_memory() {
        let f = Gemv;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let mut d = f.default_defines(GgmlType::Q4K);
        d.insert("ALGO".into(), DefineValue::Int(0));
        d.insert("XSMEM".into(), DefineValue::Int(1));
        // 36 floats per 32-element group and token.
        let g = f
            .validate(&d, &Problem::matmul(2, 5376, 21504, GgmlType::Q4K), &lim)
            .expect("two 31B ffn_down rows fit");
        assert_eq!(g.dyn_smem, 2 * 21504 / 32 * 36 * 4);
        let e = f
            .validate(&d, &Problem::matmul(3, 5376, 21504, GgmlType::Q4K), &lim)
            .expect_err("three rows do not");
        assert!(e.contains("XSMEM=0 reads them from global memory"), "{e}");
        let mut dp = d.clone();
        dp.insert("ALGO".into(), DefineValue::Int(1));
        let e = f
            .validate(&dp, &Problem::matmul(1, 64, 2560, GgmlType::Q4K), &lim)
            .expect_err("dp4a reads Q8_1");
        assert!(e.contains("needs ALGO=0"), "{e}");
        let mut h = f.default_defines(GgmlType::F16);
        h.insert("XSMEM".into(), DefineValue::Int(1));
        let e = f
            .validate(&h, &Problem::matmul(1, 64, 2568, GgmlType::F16), &lim)
            .expect_err("k % 32");
        assert!(e.contains("not a multiple of 32"), "{e}");
        d.insert("XSMEM".into(), DefineValue::Int(0));
        let g = f
            .validate(&d, &Problem::matmul(8, 5376, 21504, GgmlType::Q4K), &lim)
            .expect("global activations");
        assert_eq!(g.dyn_smem, 0);
    }

    /// The CPU form of kquant.cuh's decode, word for word: the 16-byte side
    /// header as four words, `kq_scale_min`'s byte selects, `kq_lo`/`kq_hi`
    /// and the 2^23 float trick, then the fma of `chunk_dot`. Every weight
    /// of every group must equal ggml's dequantization bit for bit.
    #[test]
    fn kquant_chunk_decode_replays_the_dequantization() {
        use crate::quant::repack::{repack_kquant, KSide};
        let word = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let qf =
            |w: u32, b: usize| f32::from_bits(0x4B00_0000 | ((w >> (8 * b)) & 0xff)) - 8_388_608.0;
        for wt in [WType::Q4K, WType::Q5K, WType::Q6K] {
            let (n, k) = (5usize, 768usize);
            let mut rng = super::super::rng_for("gemv-kq-replay", &[n, k, wt as usize], 1);
            let w = super::super::make_weights(&mut rng, wt, n, k).expect("weights");
            let p = repack_kquant(wt.ggml(), &w.gguf, n * k, KSide::Gemv).expect("repack");
            assert_eq!(p.nibbles, w.qplane);
            let rec_bytes = crate::quant::repack::gemv_side_bytes(wt.ggml());
            for row in 0..n {
                for c in 0..k / 32 {
                    let nib = &p.nibbles[row * k / 2 + 16 * c..row * k / 2 + 16 * c + 16];
                    let j = c % 8;
                    let rec = &p.side[(row * k / 256 + c / 8) * rec_bytes..][..rec_bytes];
                    let (d, d2, h) = if wt == WType::Q6K {
                        let sc = u16::from_le_bytes([rec[64 + 2 * j], rec[65 + 2 * j]]);
                        let dd = crate::quant::blocks::f16_to_f32(u16::from_le_bytes([
                            rec[80], rec[81],
                        ]));
                        (
                            dd * ((sc & 0xff) as u8 as i8) as f32,
                            dd * ((sc >> 8) as u8 as i8) as f32,
                            [word(rec, 8 * j), word(rec, 8 * j + 4)],
                        )
                    } else {
                        let hd = [word(rec, 0), word(rec, 4), word(rec, 8), word(rec, 12)];
                        let s = 8 * (j as u32 & 3);
                        let (a, b, cc) = (
                            (hd[1] >> s) & 0xff,
                            (hd[2] >> s) & 0xff,
                            (hd[3] >> s) & 0xff,
                        );
                        let (sc, m) = if j < 4 {
                            (a & 63, b & 63)
                        } else {
                            ((cc & 0x0f) | ((a >> 6) << 4), (cc >> 4) | ((b >> 6) << 4))
                        };
                        let f = |x: u32| crate::quant::blocks::f16_to_f32(x as u16);
                        let hw = if wt == WType::Q5K {
                            word(rec, 16 + 4 * j)
                        } else {
                            0
                        };
                        (
                            f(hd[0] & 0xffff) * sc as f32,
                            f(hd[0] >> 16) * m as f32,
                            [hw, 0],
                        )
                    };
                    for t in 0..4 {
                        let wv = word(nib, 4 * t);
                        let (mut lo, mut hi) = (wv & 0x0F0F_0F0F, (wv >> 4) & 0x0F0F_0F0F);
                        match wt {
                            WType::Q5K => {
                                lo |= ((h[0] >> t) & 0x0101_0101) << 4;
                                hi |= ((h[0] >> (4 + t)) & 0x0101_0101) << 4;
                            }
                            WType::Q6K => {
                                lo |= ((h[0] >> (2 * t)) & 0x0303_0303) << 4;
                                hi |= ((h[1] >> (2 * t)) & 0x0303_0303) << 4;
                            }
                            _ => {}
                        }
                        for b in 0..4 {
                            let (vl, vh) = if wt == WType::Q6K {
                                (d * (qf(lo, b) - 32.0), d2 * (qf(hi, b) - 32.0))
                            } else {
                                (qf(lo, b).mul_add(d, -d2), qf(hi, b).mul_add(d, -d2))
                            };
                            let e = row * k + 32 * c + 4 * t + b;
                            for (got, e) in [(vl, e), (vh, e + 16)] {
                                assert_eq!(
                                    got.to_bits(),
                                    w.deq[e].to_bits(),
                                    "{wt:?} row {row} group {c} element {}",
                                    e - row * k
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// kq_s6 (kquant.cuh): every unsigned 6-bit quant becomes q - 32 as a
    /// two's complement byte, in every byte position at once.
    #[test]
    fn q6_signed_bytes_trick_is_exact() {
        let s6 = |q: u32| (q ^ 0x2020_2020) | ((!q & 0x2020_2020).wrapping_mul(6));
        for q in 0u32..64 {
            for pos in 0..4 {
                let others = [7u32, 63, 0, 32];
                let mut w = 0u32;
                for (i, o) in others.iter().enumerate() {
                    w |= (if i == pos { q } else { *o }) << (8 * i);
                }
                let r = s6(w);
                for i in 0..4 {
                    let src = (w >> (8 * i)) & 0xff;
                    assert_eq!(((r >> (8 * i)) & 0xff) as u8 as i8 as i32, src as i32 - 32);
                }
            }
        }
    }

    #[test]
    fn mmq_and_the_int8_reference_reject_q6k() {
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let p = Problem::matmul(256, 1024, 2560, GgmlType::Q6K);
        let f = crate::family::family("mmq").expect("registered");
        let e = f
            .validate(&f.default_defines(GgmlType::Q6K), &p, &lim)
            .expect_err("mmq");
        assert!(e.starts_with("WTYPE=Q6_K: mmq reads Q8_0 and Q4_0"), "{e}");
        // The dequantizing GEMMs read every type.
        for name in ["gemm_dq", "gemm_wgmma"] {
            let f = crate::family::family(name).expect("registered");
            for ty in [
                GgmlType::Q4K,
                GgmlType::Q5K,
                GgmlType::Q6K,
                GgmlType::F16,
                GgmlType::Bf16,
            ] {
                let p = Problem::matmul(256, 1024, 2560, ty);
                f.validate(&f.default_defines(ty), &p, &lim)
                    .unwrap_or_else(|e| panic!("{name} {ty}: {e}"));
            }
            let e = f
                .validate(
                    &f.default_defines(GgmlType::F16),
                    &Problem::matmul(256, 1024, 2568, GgmlType::F16),
                    &lim,
                )
                .expect_err("k % 32");
            assert!(e.contains("not a multiple of 32"), "{name}: {e}");
        }
        // The bf16 reference runs on the dequantized weights of every type;
        // the int8 one needs per-32 int8 quants.
        let mp = crate::problem::MatmulProblem {
            m: 1,
            n: 1024,
            k: 2560,
            wtype: GgmlType::Q6K,
        };
        for r in crate::reference::references_for("mmq") {
            match r {
                crate::reference::RefKind::CublasBf16 => r.supports(&mp).expect("bf16"),
                crate::reference::RefKind::CublasInt8 => {
                    let e = r.supports(&mp).expect_err("int8");
                    assert!(e.contains("q6_K"), "{e}");
                }
            }
        }
    }
}
