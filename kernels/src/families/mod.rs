//! The kernel families and the host-side pieces they share: seeded inputs,
//! weight repacking into planes, the Q8_1 replay and the f64 references.

pub mod act_convert;
pub mod attention;
pub mod attn_decode;
pub mod attn_prefill;
pub mod embed;
pub mod gelu_mul;
pub mod gemm_dq;
pub mod gemm_wgmma;
pub mod gemv;
pub(crate) mod memo;
pub mod mmq;
pub mod ple;
pub mod qk_norm_rope;
pub mod quantize_q8_1;
pub mod rmsnorm;
pub(crate) mod rows_common;
pub mod softcap;
pub(crate) mod tiles;

use crate::bind::matmul::{MatmulBinding, WeightLayout, Weights};
use crate::bind::{Act, NULL};
use crate::device::LaunchGeometry;
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::problem::WType;
use crate::quant::{dequantize_row, quantize_row};
use crate::verdict::{compare, CheckReport, Contract, Tolerance};
use crate::workload::{poison, OpKind, WeightSet, Workload};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A seeded generator whose stream depends on (family, shape, seed), so every
/// shape gets its own inputs but a run is reproducible.
pub(crate) fn rng_for(family: &str, dims: &[usize], seed: u64) -> ChaCha8Rng {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in family.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
    }
    for d in dims {
        h = (h ^ *d as u64).wrapping_mul(0x100_0000_01b3);
    }
    ChaCha8Rng::seed_from_u64(h ^ seed)
}

/// Random values in [-1, 1] with a per-row scale in [0.25, 2] (so blocks
/// differ in magnitude and scale indexing errors show); never all zero.
pub(crate) fn random_matrix(rng: &mut ChaCha8Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * cols);
    for _ in 0..rows {
        let s: f32 = rng.random_range(0.25f32..2.0);
        for _ in 0..cols {
            v.push(s * rng.random_range(-1.0f32..1.0));
        }
    }
    v
}

/// Quantized weights: the GGUF bytes, the exactly dequantized values, and
/// the aligned planes (quants apart from scales).
pub(crate) struct QWeights {
    pub gguf: Vec<u8>,
    pub deq: Vec<f32>,
    /// Q8_0: int8 [n][k]; Q4_0: [n][k/2] in GGUF nibble order per block;
    /// Q6_K: empty (no plane layout).
    pub qplane: Vec<u8>,
    /// f16 bits [n][k/32]; empty for Q6_K.
    pub dplane_f16: Vec<u16>,
}

pub(crate) fn make_weights(
    rng: &mut ChaCha8Rng,
    wt: WType,
    n: usize,
    k: usize,
) -> Result<QWeights, GpuError> {
    use rayon::prelude::*;
    let ty = wt.ggml();
    let f = random_matrix(rng, n, k);
    let row_bytes = wt.row_bytes(k);
    let mut gguf = vec![0u8; n * row_bytes];
    let mut deq = vec![0f32; n * k];
    gguf.par_chunks_mut(row_bytes.max(1))
        .zip(deq.par_chunks_mut(k.max(1)))
        .zip(f.par_chunks(k.max(1)))
        .try_for_each(|((dst, out), src)| -> Result<(), GpuError> {
            quantize_row(ty, src, dst)
                .map_err(|e| GpuError::Other(format!("quantizing test weights: {e}")))?;
            dequantize_row(ty, dst, out)
                .map_err(|e| GpuError::Other(format!("dequantizing test weights: {e}")))
        })?;
    let (qplane, dplane_f16) = to_planes(wt, &gguf, n, k);
    Ok(QWeights {
        gguf,
        deq,
        qplane,
        dplane_f16,
    })
}

/// A matmul check's seeded inputs: `w.len()` weight matrices (n x k) and then
/// the activations x (m x k), drawn in that order from one generator.
pub(crate) struct SeededInputs {
    pub w: Vec<QWeights>,
    pub x: Vec<f32>,
}

/// The inputs for (tag, dims, seed), generated once per process and shared
/// by every variant checked on that shape (see `memo`). `dims` seeds the
/// generator (`rng_for`) and must name everything the shape varies in.
#[allow(clippy::too_many_arguments)]
pub(crate) fn seeded_inputs(
    tag: &str,
    dims: &[usize],
    wt: WType,
    m: usize,
    n: usize,
    k: usize,
    nmats: usize,
    seed: u64,
) -> Result<std::sync::Arc<SeededInputs>, GpuError> {
    let key = format!("inputs {tag} {dims:?} {wt:?} m{m} n{n} k{k} x{nmats} seed{seed}");
    memo::get_or_try(key, || {
        let mut rng = rng_for(tag, dims, seed);
        let mut w = Vec::with_capacity(nmats);
        for _ in 0..nmats {
            w.push(make_weights(&mut rng, wt, n, k)?);
        }
        let x = random_matrix(&mut rng, m, k);
        Ok(SeededInputs { w, x })
    })
}

/// Splits GGUF blocks into a quant plane and an f16 scale plane. Q6_K has
/// no plane layout (its kernels read the GGUF super-blocks): both planes
/// come back empty.
pub fn to_planes(wt: WType, gguf: &[u8], n: usize, k: usize) -> (Vec<u8>, Vec<u16>) {
    if wt == WType::Q6K {
        return (Vec::new(), Vec::new());
    }
    let bsz = wt.ggml().type_size();
    let qb = wt.quant_bytes_per_block();
    let nb = k / 32;
    let mut q = Vec::with_capacity(n * nb * qb);
    let mut d = Vec::with_capacity(n * nb);
    for blk in gguf.chunks_exact(bsz).take(n * nb) {
        d.push(u16::from_le_bytes([blk[0], blk[1]]));
        q.extend_from_slice(&blk[2..2 + qb]);
    }
    (q, d)
}

pub(crate) fn f16_to_f32(h: u16) -> f32 {
    crate::quant::blocks::f16_to_f32(h)
}

/// The quantize_q8_1 rule, replayed on the CPU with the same f32 operations
/// (IEEE division, round half away from zero). Returns (q, ds) with
/// ds[b] = (d, sum of q).
pub fn q8_1_replay(x: &[f32]) -> (Vec<i8>, Vec<[f32; 2]>) {
    let mut q = vec![0i8; x.len()];
    let mut ds = Vec::with_capacity(x.len() / 32);
    for (b, blk) in x.chunks_exact(32).enumerate() {
        let amax = blk.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0f32;
        let mut s = 0i32;
        for (i, &v) in blk.iter().enumerate() {
            let qi = if d != 0.0 { (v / d).round() as i32 } else { 0 };
            q[b * 32 + i] = qi as i8;
            s += qi;
        }
        ds.push([d, s as f32]);
    }
    (q, ds)
}

/// out[m][n] = sum_k x[m][k] * w[n][k] by `oracle::matmul` (f64 dot
/// products), one token row per rayon task.
pub(crate) fn matmul_f64(w: &[f32], x: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let mut out = vec![0f32; m * n];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        crate::oracle::matmul(w, &x[i * k..(i + 1) * k], 1, n, k, row);
    });
    out.into_iter().map(f64::from).collect()
}

/// The Q8_1-activation replay: sum over blocks of d_w*d_a*(integer dot), in f64.
pub(crate) fn matmul_q8_replay(
    wdeq: &[f32],
    xq: &[i8],
    xds: &[[f32; 2]],
    m: usize,
    n: usize,
    k: usize,
) -> Vec<f64> {
    let xr: Vec<f32> = xq.iter().map(|&q| q as f32).collect();
    // (q_a * d_a) may not be exact in f32, so scale per block in f64.
    use rayon::prelude::*;
    let mut out = vec![0f64; m * n];
    let nb = k / 32;
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        for (j, o) in row.iter_mut().enumerate() {
            let mut s = 0f64;
            for b in 0..nb {
                let mut blk = 0f64;
                for t in b * 32..(b + 1) * 32 {
                    blk += xr[i * k + t] as f64 * wdeq[j * k + t] as f64;
                }
                s += blk * xds[i * nb + b][0] as f64;
            }
            *o = s;
        }
    });
    out
}

pub(crate) fn gelu_tanh_f64(x: f64) -> f64 {
    crate::oracle::gelu_tanh(x as f32) as f64
}

pub(crate) type RefFn = Box<dyn Fn() -> (Vec<f64>, Option<Vec<f64>>)>;

/// The workload shared by the matmul families, launched through the
/// family's `bind::matmul::MatmulBinding` (the engine's calling convention).
pub(crate) struct MatmulWorkload {
    /// Per copy: for each weight matrix its blocks, or its quant and scale
    /// planes, in the binding's layout.
    pub weights: WeightSet,
    /// Owns the activation buffers `act` points into (never read: kept
    /// alive for the kernel).
    pub _acts: Vec<DeviceBuffer>,
    pub act: Act,
    pub y: DeviceBuffer,
    pub geo: LaunchGeometry,
    pub binding: MatmulBinding,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Computes (reference, replay) on demand: timing never needs them, and
    /// at prefill shapes they cost far more than the GPU work.
    pub reference: RefFn,
    pub bytes: u64,
    pub ops: u64,
    pub op_kind: OpKind,
}

impl MatmulWorkload {
    fn args(&self, copy: usize) -> Result<Vec<KArg>, GpuError> {
        let planes = self.weights.get(copy);
        let per = match self.binding.layout {
            WeightLayout::GgufBlocks => 1,
            WeightLayout::Planes { .. } => 2,
        };
        let w: Vec<Weights> = planes
            .chunks(per)
            .map(|c| Weights {
                q: c[0].ptr(),
                d: c.get(1).map(|b| b.ptr()).unwrap_or(NULL),
            })
            .collect();
        self.binding
            .kargs(&w, &self.act, self.y.ptr(), self.m, self.n, self.k)
            .map_err(GpuError::Rejected)
    }
}

impl Workload for MatmulWorkload {
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
        if self.binding.zero_output {
            gpu.fill_u32(&self.y, 0)?;
        }
        self.launch_kernel_only(gpu, m, copy)
    }
    fn accumulates(&self) -> bool {
        self.binding.zero_output
    }
    fn launch_kernel_only(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        gpu.launch(m, &self.geo, &self.args(copy)?)
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
        let (reference, replay) = (self.reference)();
        Ok(compare(
            &out[..reference.len()],
            &reference,
            replay.as_deref(),
            contract,
            tol,
        ))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.y)
    }
    fn bytes_per_call(&self) -> u64 {
        self.bytes
    }
    fn ops_per_call(&self) -> u64 {
        self.ops
    }
    fn op_kind(&self) -> OpKind {
        self.op_kind
    }
}

/// f32 bits of an f32 slice as u32 words (for uploads of float2 planes).
pub(crate) fn ds_words(ds: &[[f32; 2]]) -> Vec<f32> {
    ds.iter().flat_map(|p| [p[0], p[1]]).collect()
}
