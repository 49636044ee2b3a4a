//! Vendor-library reference rows: the same matmul a family computes, done
//! the way a user would do it instead, at the same shapes and in the same
//! cache regimes, so every variant is judged against what a user would
//! otherwise run.
//!
//! Problem convention as `MatmulProblem`: y[m][n] = sum_k x[m][k] * W[n][k],
//! W quantized (Q8_0 / Q4_0). References:
//!
//! - `cublas-bf16`: W dequantized once to bf16 (n x k row-major), x in bf16,
//!   `cublasGemmEx` with f32 accumulation and f32 output, cuBLAS's default
//!   algorithm (it picks its own GEMV path at 1-8 tokens). The same function
//!   as the variants, up to bf16 operand rounding.
//! - `cublas-int8`: int8 x int8 -> int32 on W's raw quants (Q8_0 quants; Q4_0
//!   nibbles minus 8) and x's Q8_1 quants (what mmq reads). It ignores the
//!   per-32 block scales, so it is not the model's matmul: it is the tensor
//!   rate an int8 GEMM reaches, the ceiling mmq's scale epilogue is measured
//!   against. It is checked bit-exact against the CPU integer product.
//!
//! Each reference is checked before it is timed (a wrong transpose or
//! leading dimension fails the check), and timed by `timing::time_workload`,
//! the loop that times the variants: the DRAM regime rotates distinct copies
//! of the reference's own weight operand past 2x L2.

pub mod cublas;

use crate::families::{matmul_f64, q8_1_replay, seeded_inputs, SeededInputs};
use crate::gpu::{DeviceBuffer, Gpu, GpuError};
use crate::problem::{matmul_of, MatmulProblem, Problem, WType};
use crate::quant::blocks::{bf16_to_f32, f32_to_bf16};
use crate::quant::{dequantize_row, GgmlType};
use crate::timing::{time_workload, Regime, Timeable, Timing, TimingConfig};
use crate::verdict::{compare, CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{OpKind, WeightSet};
pub use cublas::Cublas;
use cublas::GemmType;
use thiserror::Error;

/// A vendor reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RefKind {
    CublasBf16,
    CublasInt8,
}

impl RefKind {
    pub const ALL: [RefKind; 2] = [RefKind::CublasBf16, RefKind::CublasInt8];

    /// The name in reports ("cublas-bf16").
    pub fn name(self) -> &'static str {
        match self {
            RefKind::CublasBf16 => "cublas-bf16",
            RefKind::CublasInt8 => "cublas-int8",
        }
    }

    pub fn from_name(s: &str) -> Option<RefKind> {
        RefKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// The library, for the `family` column of reference rows.
    pub fn library(self) -> &'static str {
        "cublas"
    }

    /// What the row measures, for the reader.
    pub fn note(self) -> &'static str {
        match self {
            RefKind::CublasBf16 => {
                "cublasGemmEx on W dequantized once to bf16 (n x k) and x in bf16, \
                 f32 accumulation (CUBLAS_COMPUTE_32F), f32 output, default algorithm: \
                 the cuBLAS path a user would pick"
            }
            RefKind::CublasInt8 => {
                "cublasGemmEx int8 x int8 -> int32 (CUBLAS_COMPUTE_32I) on W's int8 quants \
                 (Q8_0 quants; Q4_0 nibbles - 8) and x's Q8_1 quants; ignores the per-32 \
                 block scales, so it is the int8 tensor-rate reference for mmq, not the \
                 same function"
            }
        }
    }

    pub fn op_kind(self) -> OpKind {
        match self {
            RefKind::CublasBf16 => OpKind::Flop,
            RefKind::CublasInt8 => OpKind::IntOp,
        }
    }

    fn gemm_type(self) -> GemmType {
        match self {
            RefKind::CublasBf16 => GemmType::Bf16,
            RefKind::CublasInt8 => GemmType::Int8,
        }
    }

    /// Bytes per operand element.
    fn elem_bytes(self) -> usize {
        match self {
            RefKind::CublasBf16 => 2,
            RefKind::CublasInt8 => 1,
        }
    }

    /// Rejects shapes this reference cannot run, with the rule broken.
    pub fn supports(self, mp: &MatmulProblem) -> Result<(), String> {
        if mp.m == 0 || mp.n == 0 || mp.k == 0 {
            return Err("m, n and k must be positive".into());
        }
        if ref_wtype(self, mp.wtype).is_none() {
            return Err(match self {
                RefKind::CublasInt8 => format!(
                    "weights of type {} cannot be repacked (only Q8_0 and Q4_0)",
                    mp.wtype.name()
                ),
                RefKind::CublasBf16 => format!(
                    "weights of type {} are not a matmul weight type",
                    mp.wtype.name()
                ),
            });
        }
        if mp.k % 32 != 0 {
            return Err(format!(
                "k={} is not a multiple of the 32-element block",
                mp.k
            ));
        }
        for (v, what) in [(mp.m, "m"), (mp.n, "n"), (mp.k, "k")] {
            if i32::try_from(v).is_err() {
                return Err(format!("{what}={v} exceeds cuBLAS's 32-bit dimensions"));
            }
        }
        if self == RefKind::CublasInt8 {
            // cuBLAS int8 GEMM: lda and ldb (= k here) multiples of 4.
            if mp.k % 4 != 0 {
                return Err(format!("int8 GEMM needs k % 4 == 0 (lda, ldb), k={}", mp.k));
            }
            // |sum| <= 127 * 128 * k must stay below the int32 poison pattern.
            if mp.k > INT8_MAX_K {
                return Err(format!(
                    "k={} > {INT8_MAX_K}: int32 sums could overflow",
                    mp.k
                ));
            }
        }
        Ok(())
    }

    /// The check's bounds. bf16: both operands rounded to bf16 (u = 2^-8)
    /// gives a relative RMS error near u*sqrt(2/3); the bound allows ~4x,
    /// as for gemm_dq with BF16 tiles, and the replay on bf16-rounded
    /// operands differs by f32 summation only. int8 is compared exactly.
    pub fn tolerance(self, k: usize) -> Tolerance {
        match self {
            RefKind::CublasBf16 => crate::families::gemm_dq::rounded_operands_tolerance(true, k),
            RefKind::CublasInt8 => Tolerance {
                rms_rel: 0.0,
                max_rel: 0.0,
                outlier_frac: 0.0,
                replay_rms_rel: 0.0,
            },
        }
    }

    pub fn contract(self) -> Contract {
        match self {
            RefKind::CublasBf16 => Contract::Approx,
            RefKind::CublasInt8 => Contract::Bitexact,
        }
    }
}

/// The weight type of a GGML type the int8 reference repacks (Q8_0, Q4_0:
/// the types with per-32 int8 quants).
fn wtype_of(t: GgmlType) -> Option<WType> {
    [WType::Q8_0, WType::Q4_0]
        .into_iter()
        .find(|w| w.ggml() == t)
}

/// The weight types a reference runs: bf16 on the dequantized weights takes
/// every matmul weight type, int8 the two with int8 quants.
fn ref_wtype(kind: RefKind, t: GgmlType) -> Option<WType> {
    match kind {
        RefKind::CublasBf16 => WType::of(t),
        RefKind::CublasInt8 => wtype_of(t),
    }
}

/// Largest k the int8 reference accepts.
pub const INT8_MAX_K: usize = 65536;

/// The references a family's rows are judged against. A new matmul family
/// adds its name here; families that are not matmuls have none.
pub fn references_for(family: &str) -> &'static [RefKind] {
    match family {
        "gemv" | "gemm_dq" | "gemm_wgmma" => &[RefKind::CublasBf16],
        "mmq" => &[RefKind::CublasBf16, RefKind::CublasInt8],
        _ => &[],
    }
}

#[derive(Debug, Error)]
pub enum RefError {
    /// The library cannot be loaded or initialised.
    #[error("{0}")]
    Unavailable(String),
    /// The library cannot run this shape (a documented rule, or cuBLAS said
    /// NOT_SUPPORTED).
    #[error("{0}")]
    Unsupported(String),
    #[error(transparent)]
    Gpu(GpuError),
}

impl From<GpuError> for RefError {
    fn from(e: GpuError) -> RefError {
        match e {
            GpuError::Rejected(r) => RefError::Unsupported(r),
            e => RefError::Gpu(e),
        }
    }
}

impl RefError {
    /// The verdict word for a report row: unavailable | unsupported | error.
    pub fn verdict(&self) -> &'static str {
        match self {
            RefError::Unavailable(_) => "unavailable",
            RefError::Unsupported(_) => "unsupported",
            RefError::Gpu(_) => "error",
        }
    }
}

/// W (n x k, row-major) dequantized by the CPU dequantizer and rounded to
/// bf16 (nearest even): the weight operand of `cublas-bf16`.
pub fn bf16_weights(wt: GgmlType, gguf: &[u8], n: usize, k: usize) -> Result<Vec<u16>, String> {
    let row_bytes = wt
        .row_bytes(k as u64)
        .ok_or_else(|| format!("k={k} is not a whole number of {} blocks", wt.name()))?
        as usize;
    if gguf.len() < n * row_bytes {
        return Err(format!(
            "{} bytes of weights, {n} rows need {}",
            gguf.len(),
            n * row_bytes
        ));
    }
    let mut row = vec![0f32; k];
    let mut out = Vec::with_capacity(n * k);
    for r in 0..n {
        dequantize_row(wt, &gguf[r * row_bytes..(r + 1) * row_bytes], &mut row)
            .map_err(|e| e.to_string())?;
        out.extend(row.iter().map(|&v| f32_to_bf16(v)));
    }
    Ok(out)
}

/// W's quants as int8 (n x k, row-major): Q8_0's quants as stored; Q4_0's
/// nibbles minus 8 in element order (low nibbles are elements 0-15 of a
/// block, high nibbles 16-31). Element i of a row times its block's scale is
/// exactly the CPU dequantized value.
pub fn int8_weights(wt: GgmlType, gguf: &[u8], n: usize, k: usize) -> Result<Vec<i8>, String> {
    let w = wtype_of(wt).ok_or_else(|| format!("{} has no int8 quants to repack", wt.name()))?;
    if k % 32 != 0 {
        return Err(format!("k={k} is not a multiple of 32"));
    }
    let bsz = wt.type_size();
    let blocks = n * k / 32;
    if gguf.len() < blocks * bsz {
        return Err(format!(
            "{} bytes of weights, {blocks} blocks need {}",
            gguf.len(),
            blocks * bsz
        ));
    }
    let mut out = Vec::with_capacity(n * k);
    for blk in gguf.chunks_exact(bsz).take(blocks) {
        let qs = &blk[2..];
        match w {
            WType::Q8_0 => out.extend(qs[..32].iter().map(|&b| b as i8)),
            WType::Q4_0 => {
                out.extend(qs[..16].iter().map(|&b| (b & 0x0f) as i8 - 8));
                out.extend(qs[..16].iter().map(|&b| (b >> 4) as i8 - 8));
            }
            other => {
                return Err(format!(
                    "{} has no per-32 int8 quants to repack",
                    other.define()
                ))
            }
        }
    }
    Ok(out)
}

/// y[m][n] = sum_k x[m][k] * w[n][k] in exact integer arithmetic (the
/// CPU product `cublas-int8` must equal), one token row per rayon task.
/// Callers pass w of n*k and x of m*k elements (the operands it uploaded).
pub(crate) fn int8_matmul(w: &[i8], x: &[i8], m: usize, n: usize, k: usize) -> Vec<i32> {
    use rayon::prelude::*;
    let mut out = vec![0i32; m * n];
    out.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            let xr = &x[i * k..(i + 1) * k];
            for (j, o) in row.iter_mut().enumerate() {
                let wr = &w[j * k..(j + 1) * k];
                *o = xr.iter().zip(wr).map(|(&a, &b)| a as i32 * b as i32).sum();
            }
        });
    out
}

/// Judges an int32 output against the exact product: every element must
/// match; elements still holding the poison pattern count as unwritten.
pub fn compare_exact(out: &[i32], want: &[i32]) -> CheckReport {
    let n = out.len().min(want.len());
    let poison = POISON_BITS as i32;
    let mut unwritten = 0usize;
    let mut mism = 0usize;
    let mut first: Option<usize> = None;
    let (mut e2, mut max_abs, mut max_rel) = (0f64, 0f64, 0f64);
    let r2: f64 = want[..n].iter().map(|&v| (v as f64).powi(2)).sum();
    let rms = (r2 / n.max(1) as f64).sqrt();
    for i in 0..n {
        if out[i] != want[i] {
            mism += 1;
            first.get_or_insert(i);
        }
        // Unwritten elements are counted, not measured (as `compare` does
        // with NaN).
        if out[i] == poison {
            unwritten += 1;
            continue;
        }
        let e = (out[i] as f64 - want[i] as f64).abs();
        e2 += e * e;
        max_abs = max_abs.max(e);
        max_rel = max_rel.max(e / ((want[i] as f64).abs() + rms + f64::MIN_POSITIVE));
    }
    if out.len() != want.len() {
        mism += out.len().abs_diff(want.len());
    }
    let detail = match first {
        None if mism == 0 => format!("ok ({n} outputs, exact)"),
        _ => {
            let i = first.unwrap_or(n);
            let mut d = format!("{mism} of {n} elements differ");
            if i < n {
                d.push_str(&format!(" (first at {i}: got {} want {})", out[i], want[i]));
            }
            if unwritten > 0 {
                d.push_str(&format!("; {unwritten} outputs unwritten"));
            }
            d
        }
    };
    CheckReport {
        passed: mism == 0,
        rms_rel: if r2 > 0.0 {
            (e2 / r2).sqrt()
        } else {
            e2.sqrt()
        },
        max_rel,
        max_abs,
        outliers: mism,
        replay_rms_rel: None,
        unwritten,
        non_finite: 0,
        detail,
    }
}

/// The seeded inputs of one reference problem (memoized with the families'
/// inputs, see `families::seeded_inputs`): one weight matrix, then x.
fn host_inputs(
    kind: RefKind,
    mp: &MatmulProblem,
    seed: u64,
) -> Result<std::sync::Arc<SeededInputs>, RefError> {
    let wt = ref_wtype(kind, mp.wtype)
        .ok_or_else(|| RefError::Unsupported(format!("{} weights", mp.wtype.name())))?;
    let dims = [mp.m, mp.n, mp.k, wt as usize];
    Ok(seeded_inputs(
        kind.name(),
        &dims,
        wt,
        mp.m,
        mp.n,
        mp.k,
        1,
        seed,
    )?)
}

/// The device operands of one reference call and the handle that runs it.
pub struct RefWorkload<'c> {
    kind: RefKind,
    cublas: &'c Cublas,
    weights: WeightSet,
    x: DeviceBuffer,
    y: DeviceBuffer,
    m: usize,
    n: usize,
    k: usize,
}

/// Host copies of the operands as uploaded (for the check's CPU side).
enum Operands {
    Bf16 { w: Vec<u16>, x: Vec<u16> },
    Int8 { w: Vec<i8>, x: Vec<i8> },
}

fn operands(kind: RefKind, mp: &MatmulProblem, h: &SeededInputs) -> Result<Operands, RefError> {
    let bad = |e: String| RefError::Gpu(GpuError::Other(format!("{}: {e}", kind.name())));
    Ok(match kind {
        RefKind::CublasBf16 => Operands::Bf16 {
            w: bf16_weights(mp.wtype, &h.w[0].gguf, mp.n, mp.k).map_err(bad)?,
            x: h.x.iter().map(|&v| f32_to_bf16(v)).collect(),
        },
        RefKind::CublasInt8 => Operands::Int8 {
            w: int8_weights(mp.wtype, &h.w[0].gguf, mp.n, mp.k).map_err(bad)?,
            x: q8_1_replay(&h.x).0,
        },
    })
}

impl<'c> RefWorkload<'c> {
    fn upload(
        gpu: &Gpu,
        cublas: &'c Cublas,
        kind: RefKind,
        mp: &MatmulProblem,
        ops: &Operands,
    ) -> Result<RefWorkload<'c>, RefError> {
        let (w, x) = match ops {
            Operands::Bf16 { w, x } => (gpu.upload(w)?, gpu.upload(x)?),
            Operands::Int8 { w, x } => (gpu.upload(w)?, gpu.upload(x)?),
        };
        let y = gpu.alloc(mp.m * mp.n * 4)?;
        Ok(RefWorkload {
            kind,
            cublas,
            weights: WeightSet::new(vec![w]),
            x,
            y,
            m: mp.m,
            n: mp.n,
            k: mp.k,
        })
    }

    /// Seeded inputs for `kind` on `mp`, repacked and uploaded.
    pub fn new(
        gpu: &Gpu,
        cublas: &'c Cublas,
        kind: RefKind,
        mp: &MatmulProblem,
        seed: u64,
    ) -> Result<RefWorkload<'c>, RefError> {
        kind.supports(mp).map_err(RefError::Unsupported)?;
        let h = host_inputs(kind, mp, seed)?;
        let ops = operands(kind, mp, &h)?;
        RefWorkload::upload(gpu, cublas, kind, mp, &ops)
    }
}

impl Timeable for RefWorkload<'_> {
    fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.weights.set_copies(gpu, n)
    }
    fn weight_copies(&self) -> usize {
        self.weights.copies.len()
    }
    fn enqueue(&self, gpu: &Gpu, copy: usize) -> Result<(), GpuError> {
        let w = &self.weights.get(copy)[0];
        self.cublas
            .gemm_tn(
                gpu,
                self.kind.gemm_type(),
                self.m,
                self.n,
                self.k,
                w,
                &self.x,
                &self.y,
            )
            .map_err(|e| cublas::to_gpu_error(self.kind.name(), e))
    }
    /// Weights once in the reference's own operand type, activations in it
    /// too, and the 4-byte outputs.
    fn bytes_per_call(&self) -> u64 {
        let e = self.kind.elem_bytes();
        (self.n * self.k * e + self.m * self.k * e + self.m * self.n * 4) as u64
    }
    fn ops_per_call(&self) -> u64 {
        2 * (self.m * self.n * self.k) as u64
    }
    fn op_kind(&self) -> OpKind {
        self.kind.op_kind()
    }
}

/// Runs `kind` once on seeded inputs of `p` and judges the output: bf16
/// against the f64 oracle on the dequantized weights (and the replay on the
/// bf16-rounded operands), int8 exactly against the CPU integer product.
pub fn check_reference(
    gpu: &Gpu,
    cublas: &Cublas,
    kind: RefKind,
    p: &Problem,
    seed: u64,
) -> Result<CheckReport, RefError> {
    let mp = matmul_of(p).map_err(RefError::Unsupported)?;
    kind.supports(mp).map_err(RefError::Unsupported)?;
    let h = host_inputs(kind, mp, seed)?;
    let ops = operands(kind, mp, &h)?;
    let wl = RefWorkload::upload(gpu, cublas, kind, mp, &ops)?;
    gpu.fill_u32(&wl.y, POISON_BITS)?;
    wl.enqueue(gpu, 0)?;
    gpu.synchronize()?;
    let (m, n, k) = (mp.m, mp.n, mp.k);
    Ok(match &ops {
        Operands::Bf16 { w, x } => {
            let out: Vec<f32> = gpu.download(&wl.y)?;
            let wr: Vec<f32> = w.iter().map(|&b| bf16_to_f32(b)).collect();
            let xr: Vec<f32> = x.iter().map(|&b| bf16_to_f32(b)).collect();
            let reference = matmul_f64(&h.w[0].deq, &h.x, m, n, k);
            let replay = matmul_f64(&wr, &xr, m, n, k);
            compare(
                &out[..m * n],
                &reference,
                Some(&replay),
                kind.contract(),
                &kind.tolerance(k),
            )
        }
        Operands::Int8 { w, x } => {
            let out: Vec<i32> = gpu.download(&wl.y)?;
            compare_exact(&out[..m * n], &int8_matmul(w, x, m, n, k))
        }
    })
}

/// Times `kind` on `p` in `regime` with the variants' timing loop.
pub fn time_reference(
    gpu: &Gpu,
    cublas: &Cublas,
    kind: RefKind,
    p: &Problem,
    regime: Regime,
    cfg: &TimingConfig,
) -> Result<Timing, RefError> {
    let mp = matmul_of(p).map_err(RefError::Unsupported)?;
    let mut wl = RefWorkload::new(gpu, cublas, kind, mp, crate::timing::TIMING_SEED)?;
    Ok(time_workload(gpu, &mut wl, regime, cfg)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::families::{make_weights, rng_for, QWeights};
    use crate::quant::blocks::f16_to_f32;

    fn weights(wt: WType, n: usize, k: usize) -> QWeights {
        let mut rng = rng_for("test", &[n, k], 3);
        make_weights(&mut rng, wt, n, k).unwrap()
    }

    #[test]
    fn int8_weights_times_scale_is_the_cpu_dequant() {
        for wt in [WType::Q8_0, WType::Q4_0] {
            let (n, k) = (5, 96);
            let w = weights(wt, n, k);
            let q = int8_weights(wt.ggml(), &w.gguf, n, k).unwrap();
            assert_eq!(q.len(), n * k);
            for r in 0..n {
                for i in 0..k {
                    let d = f16_to_f32(w.dplane_f16[r * (k / 32) + i / 32]);
                    let want = w.deq[r * k + i];
                    assert_eq!(q[r * k + i] as f32 * d, want, "{wt:?} row {r} col {i}");
                }
            }
            if wt == WType::Q4_0 {
                assert!(q.iter().all(|&v| (-8..=7).contains(&v)));
            }
        }
    }

    #[test]
    fn bf16_weights_round_the_cpu_dequant_in_row_major_order() {
        for wt in [WType::Q8_0, WType::Q4_0] {
            let (n, k) = (3, 64);
            let w = weights(wt, n, k);
            let b = bf16_weights(wt.ggml(), &w.gguf, n, k).unwrap();
            assert_eq!(b.len(), n * k);
            for (i, (&h, &d)) in b.iter().zip(&w.deq).enumerate() {
                assert_eq!(h, f32_to_bf16(d), "element {i}");
                let back = bf16_to_f32(h);
                assert!(
                    (back - d).abs() <= d.abs() * f32::powi(2.0, -8),
                    "{back} vs {d}"
                );
            }
        }
        assert!(bf16_weights(GgmlType::Q8_0, &[0u8; 10], 1, 32).is_err());
        assert!(int8_weights(GgmlType::F32, &[0u8; 128], 1, 32).is_err());
    }

    #[test]
    fn int8_matmul_is_the_integer_product() {
        // w = [[1, 2, 3, 4], [-1, 0, 1, 127]], x = [[1, 1, 1, 1], [2, -3, 0, 1]]
        let w = [1i8, 2, 3, 4, -1, 0, 1, 127];
        let x = [1i8, 1, 1, 1, 2, -3, 0, 1];
        assert_eq!(int8_matmul(&w, &x, 2, 2, 4), [10, 127, 0, 125]);
        let r = compare_exact(&[10, 127, 0, 125], &[10, 127, 0, 125]);
        assert!(r.passed, "{}", r.detail);
        let r = compare_exact(&[10, POISON_BITS as i32, 0, 126], &[10, 127, 0, 125]);
        assert!(!r.passed);
        assert_eq!((r.outliers, r.unwritten, r.max_abs), (2, 1, 1.0));
        assert!(
            r.detail.starts_with("2 of 4 elements differ (first at 1"),
            "{}",
            r.detail
        );
    }

    #[test]
    fn shape_rules_and_family_lists() {
        let p = |m, n, k, wtype| MatmulProblem { m, n, k, wtype };
        assert!(RefKind::CublasBf16
            .supports(&p(113, 1000, 2592, GgmlType::Q4_0))
            .is_ok());
        assert!(RefKind::CublasInt8
            .supports(&p(1, 1000, 2592, GgmlType::Q8_0))
            .is_ok());
        let e = RefKind::CublasInt8
            .supports(&p(1, 8, INT8_MAX_K + 32, GgmlType::Q8_0))
            .unwrap_err();
        assert!(e.contains("overflow"), "{e}");
        assert!(RefKind::CublasBf16
            .supports(&p(1, 8, 48, GgmlType::Q8_0))
            .unwrap_err()
            .contains("multiple of the 32-element block"));
        // bf16 runs every matmul weight type (dequantized), int8 only the
        // types with int8 quants; neither a type no matmul family reads.
        assert!(RefKind::CublasBf16
            .supports(&p(1, 8, 256, GgmlType::Q4K))
            .is_ok());
        assert!(RefKind::CublasInt8
            .supports(&p(1, 8, 256, GgmlType::Q4K))
            .is_err());
        assert!(RefKind::CublasBf16
            .supports(&p(1, 8, 64, GgmlType::Q4_1))
            .is_err());
        assert_eq!(references_for("mmq"), RefKind::ALL);
        assert_eq!(references_for("gemv"), [RefKind::CublasBf16]);
        assert!(references_for("quantize_q8_1").is_empty());
        for k in RefKind::ALL {
            assert_eq!(RefKind::from_name(k.name()), Some(k));
        }
    }

    #[test]
    fn missing_library_reason_says_how_to_fix_it() {
        assert!(cublas::HOW_TO_LOAD.contains("libcublas.so.13"));
        assert!(cublas::HOW_TO_LOAD.contains("nvidia-cublas"));
        assert!(cublas::HOW_TO_LOAD.contains("LD_LIBRARY_PATH"));
        if let Err(e) = cublas::available() {
            assert_eq!(e.to_string(), cublas::HOW_TO_LOAD);
        }
    }
}
