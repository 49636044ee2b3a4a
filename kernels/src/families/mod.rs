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
mod gemv_tail;
pub(crate) mod memo;
pub mod mmq;
pub mod moe_gemm;
pub mod moe_gemv;
pub mod moe_route;
pub mod ple;
pub mod qk_norm_rope;
pub mod quantize_q8_1;
pub mod rmsnorm;
pub(crate) mod rows_common;
pub mod scale_expand;
pub mod softcap;
pub(crate) mod tiles;

use crate::bind::matmul::{MatmulBinding, ScaleType, WeightLayout, Weights};
use crate::bind::{Act, ActFormat, NULL};
use crate::device::LaunchGeometry;
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::problem::WType;
use crate::quant::repack::{repack_kquant, KSide};
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
    /// the k-quants: their nibble plane (`quant::repack`); empty for Q6_K
    /// read as GGUF blocks only and for F16/BF16 (read as they are).
    pub qplane: Vec<u8>,
    /// f16 bits [n][k/32] (Q8_0 and Q4_0 only).
    pub dplane_f16: Vec<u16>,
    /// The k-quants' GEMV side records and GEMM side words
    /// (`quant::repack`); empty for the other types.
    pub side_gemv: Vec<u8>,
    pub side_gemm: Vec<u8>,
}

impl QWeights {
    /// Uploads the matrix in `layout` (`bind::matmul`): the GGUF bytes, or
    /// the quant plane and the scale/side plane, in the binding's order.
    pub fn upload(
        &self,
        gpu: &Gpu,
        wt: WType,
        layout: WeightLayout,
    ) -> Result<Vec<DeviceBuffer>, GpuError> {
        Ok(match layout {
            WeightLayout::GgufBlocks => vec![gpu.upload(&self.gguf)?],
            WeightLayout::Planes { .. } if wt.is_16bit() => vec![gpu.upload(&self.gguf)?],
            WeightLayout::Planes { scales } if wt.is_kquant() => vec![
                gpu.upload(&self.qplane)?,
                gpu.upload(match scales {
                    ScaleType::F16 => &self.side_gemv,
                    ScaleType::F32 => &self.side_gemm,
                })?,
            ],
            WeightLayout::Planes {
                scales: ScaleType::F16,
            } => vec![gpu.upload(&self.qplane)?, gpu.upload(&self.dplane_f16)?],
            WeightLayout::Planes {
                scales: ScaleType::F32,
            } => vec![
                gpu.upload(&self.qplane)?,
                gpu.upload(&mmq::scales_f32(&self.dplane_f16))?,
            ],
        })
    }
}

/// Random, valid Q4_K / Q5_K super-blocks for `n` rows of `k` (ggml ships
/// no reference quantizer we mirror for them): per row a magnitude in
/// [0.25, 2] as `random_matrix`; per super-block `d` and `dmin` of that
/// magnitude (about one in eight negative, which the format allows);
/// random 6-bit scales and mins and random quants, so every bit of every
/// field is exercised.
pub(crate) fn random_kquant_blocks(
    rng: &mut ChaCha8Rng,
    ty: crate::quant::GgmlType,
    n: usize,
    k: usize,
) -> Vec<u8> {
    let ts = ty.type_size();
    let qmax = if ty == crate::quant::GgmlType::Q5K {
        31.0
    } else {
        15.0
    };
    let mut out = vec![0u8; n * k / 256 * ts];
    for row in out.chunks_exact_mut(k / 256 * ts) {
        let s: f32 = rng.random_range(0.25f32..2.0);
        for b in row.chunks_exact_mut(ts) {
            rng.fill(b);
            let mut f16 = |scale: f32| {
                let sign = if rng.random_range(0..8) == 0 {
                    -1.0
                } else {
                    1.0
                };
                let v = sign * scale * rng.random_range(0.5f32..1.0);
                half::f16::from_f32(v).to_bits().to_le_bytes()
            };
            let d = f16(s / (qmax * 48.0));
            let dmin = f16(s / 64.0);
            b[0..2].copy_from_slice(&d);
            b[2..4].copy_from_slice(&dmin);
        }
    }
    out
}

pub(crate) fn make_weights(
    rng: &mut ChaCha8Rng,
    wt: WType,
    n: usize,
    k: usize,
) -> Result<QWeights, GpuError> {
    use rayon::prelude::*;
    let ty = wt.ggml();
    let row_bytes = wt.row_bytes(k);
    let mut deq = vec![0f32; n * k];
    let gguf = if ty.can_quantize() {
        let f = random_matrix(rng, n, k);
        let mut gguf = vec![0u8; n * row_bytes];
        gguf.par_chunks_mut(row_bytes.max(1))
            .zip(deq.par_chunks_mut(k.max(1)))
            .zip(f.par_chunks(k.max(1)))
            .try_for_each(|((dst, out), src)| -> Result<(), GpuError> {
                quantize_row(ty, src, dst)
                    .map_err(|e| GpuError::Other(format!("quantizing test weights: {e}")))?;
                dequantize_row(ty, dst, out)
                    .map_err(|e| GpuError::Other(format!("dequantizing test weights: {e}")))
            })?;
        gguf
    } else {
        let gguf = random_kquant_blocks(rng, ty, n, k);
        dequantize_row(ty, &gguf, &mut deq)
            .map_err(|e| GpuError::Other(format!("dequantizing test weights: {e}")))?;
        gguf
    };
    let (mut qplane, dplane_f16) = to_planes(wt, &gguf, n, k);
    let (mut side_gemv, mut side_gemm) = (Vec::new(), Vec::new());
    if wt.is_kquant() {
        let err =
            |e: crate::quant::QuantError| GpuError::Other(format!("repacking test weights: {e}"));
        let g = repack_kquant(ty, &gguf, n * k, KSide::Gemv).map_err(err)?;
        let m = repack_kquant(ty, &gguf, n * k, KSide::Gemm).map_err(err)?;
        qplane = g.nibbles;
        side_gemv = g.side;
        side_gemm = m.side;
    }
    Ok(QWeights {
        gguf,
        deq,
        qplane,
        dplane_f16,
        side_gemv,
        side_gemm,
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

/// Splits Q8_0 / Q4_0 GGUF blocks into a quant plane and an f16 scale
/// plane (`quant::repack::block32_planes`). Every other type comes back as
/// two empty planes: the k-quants have their own repack (`quant::repack`,
/// `bind::matmul`'s `device_weights`) and F16/BF16 are read as they are.
pub fn to_planes(wt: WType, gguf: &[u8], n: usize, k: usize) -> (Vec<u8>, Vec<u16>) {
    crate::quant::repack::block32_planes(wt.ggml(), gguf, n, k)
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

pub use crate::bind::Q8_SPLIT_RECORD;

/// The split Q8 records of `x` (whole 32-element groups), byte for byte as
/// the kernels write them (`q8_split.cuh`: gemv ALGO 2's `split_rows`,
/// `split_write4` of act_out.cuh and the quantize pre-pass): per group,
/// d1 = amax / 127, q1 = rint(x * (1 / d1)) (ties to even, each f32 op
/// rounded once, 0 when d1 = 0), the residual `x - d1 * q1` in one fused
/// rounding, q2 of it the same way, and the integer sums.
pub fn q8_split_records(x: &[f32]) -> Vec<u8> {
    let q8 = |v: f32, d: f32| -> i32 {
        if d != 0.0 {
            (v * (1.0f32 / d)).round_ties_even() as i32
        } else {
            0
        }
    };
    let mut out = Vec::with_capacity(x.len() / 32 * Q8_SPLIT_RECORD);
    for blk in x.chunks_exact(32) {
        let d1 = blk.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0f32;
        let q1: Vec<i32> = blk.iter().map(|&v| q8(v, d1)).collect();
        let r: Vec<f32> = blk
            .iter()
            .zip(&q1)
            .map(|(&v, &q)| (-d1).mul_add(q as f32, v))
            .collect();
        let d2 = r.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0f32;
        let q2: Vec<i32> = r.iter().map(|&v| q8(v, d2)).collect();
        out.extend(q1.iter().map(|&q| q as i8 as u8));
        out.extend(q2.iter().map(|&q| q as i8 as u8));
        out.extend(d1.to_le_bytes());
        out.extend(d2.to_le_bytes());
        out.extend(q1.iter().sum::<i32>().to_le_bytes());
        out.extend(q2.iter().sum::<i32>().to_le_bytes());
    }
    out
}

/// The first `n` values the split records in `bytes` carry, each
/// `d1 * q1 + d2 * q2` in f64 (the kernels scale the two integer dots
/// apart, so the parts are never added in f32).
pub fn q8_split_values(bytes: &[u8], n: usize) -> Vec<f64> {
    let f = |b: &[u8]| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    let mut out = Vec::with_capacity(n);
    for rec in bytes.chunks_exact(Q8_SPLIT_RECORD) {
        let (d1, d2) = (f(&rec[64..68]), f(&rec[68..72]));
        for i in 0..32 {
            if out.len() == n {
                return out;
            }
            out.push(d1 * rec[i] as i8 as f64 + d2 * rec[32 + i] as i8 as f64);
        }
    }
    out
}

/// The values the split Q8 activations of `x` carry (gemv ALGO 2 and 3).
pub(crate) fn split_q8_replay(x: &[f32]) -> Vec<f64> {
    q8_split_values(&q8_split_records(x), x.len())
}

/// A replay of outputs a kernel writes as split records (gemv OUT=Q8_SPLIT,
/// moe_gemv H_RECORDS=1): the f64 values rounded to the f32 the kernel
/// splits, then split by the same rule.
pub(crate) fn split_output_replay(values: &[f64]) -> Vec<f64> {
    let y32: Vec<f32> = values.iter().map(|&v| v as f32).collect();
    split_q8_replay(&y32)
}

/// The first `n` values of the split records in `buf`, as f32 (a
/// poisoned, unwritten record reads as NaN): how a check reads back the
/// outputs a kernel wrote as records.
pub(crate) fn download_split_values(
    gpu: &Gpu,
    buf: &DeviceBuffer,
    n: usize,
) -> Result<Vec<f32>, GpuError> {
    let bytes: Vec<u8> = gpu.download(buf)?;
    let used = ActFormat::Q8Split.bytes(1, n);
    Ok(q8_split_values(&bytes[..used.min(bytes.len())], n)
        .into_iter()
        .map(|v| v as f32)
        .collect())
}

/// out[m][n] = sum_k x[m][k] * w[n][k] with f64 activations, in f64.
pub(crate) fn matmul_f64_x(w: &[f32], x: &[f64], m: usize, n: usize, k: usize) -> Vec<f64> {
    use rayon::prelude::*;
    let mut out = vec![0f64; m * n];
    out.par_chunks_mut(n).enumerate().for_each(|(i, row)| {
        let xr = &x[i * k..(i + 1) * k];
        for (j, o) in row.iter_mut().enumerate() {
            *o = w[j * k..(j + 1) * k]
                .iter()
                .zip(xr)
                .map(|(&a, &b)| a as f64 * b)
                .sum();
        }
    });
    out
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
    /// The side operand of a gemv FUSE=2 binding (`[m][n]` f32).
    pub side: Option<DeviceBuffer>,
    /// The sandwich-norm operands of a gemv TAIL=1 binding.
    pub tail: Option<TailBuffers>,
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

/// The device operands of a gemv TAIL=1 check: the residual in (`h_in`)
/// and out (`h_out`, a separate buffer so that every call computes the same
/// step), the norm weights and scalar, the normalized output in `format`
/// (`out`, with `out_ds` for Q8_1's scales) and the scratch (the arrival
/// counter, zeroed, and the blocks' partial sums).
pub(crate) struct TailBuffers {
    pub h_in: DeviceBuffer,
    pub h_out: DeviceBuffer,
    pub w_add: DeviceBuffer,
    pub scale: DeviceBuffer,
    pub w_out: DeviceBuffer,
    pub out: DeviceBuffer,
    pub out_ds: DeviceBuffer,
    pub scratch: DeviceBuffer,
    /// The normalized output's format; `None`: the residual only.
    pub format: Option<ActFormat>,
    pub eps: f32,
}

impl TailBuffers {
    fn operands(&self) -> crate::bind::matmul::Tail {
        crate::bind::matmul::Tail {
            h_in: self.h_in.ptr(),
            h_out: self.h_out.ptr(),
            w_add: self.w_add.ptr(),
            scale: self.scale.ptr(),
            w_out: self.w_out.ptr(),
            out: Act {
                format: self.format.unwrap_or(ActFormat::F32),
                data: self.format.map_or(NULL, |_| self.out.ptr()),
                scales: self.out_ds.ptr(),
            },
            scratch: self.scratch.ptr(),
            eps: self.eps,
        }
    }

    /// The buffers a checked run must write, poisoned before it.
    fn outputs(&self) -> Vec<&DeviceBuffer> {
        let mut v = vec![&self.h_out];
        if self.format.is_some() {
            v.push(&self.out);
        }
        v
    }

    /// The updated residual, then the normalized output decoded to f32,
    /// `values` each.
    fn read(&self, gpu: &Gpu, values: usize) -> Result<Vec<f32>, GpuError> {
        let mut v: Vec<f32> = gpu.download(&self.h_out)?;
        v.truncate(values);
        if let Some(f) = self.format {
            let words: Vec<u32> = gpu.download(&self.out)?;
            let ds: Vec<f32> = gpu.download(&self.out_ds)?;
            v.extend(rows_common::act_decode(f, &words, &ds, values));
        }
        Ok(v)
    }
}

impl MatmulWorkload {
    fn args(&self, copy: usize) -> Result<Vec<KArg>, GpuError> {
        let planes = self.weights.get(copy);
        // One or two buffers per matrix (blocks, or quant and scale planes;
        // F16/BF16 have one in every layout).
        let per = (planes.len() / self.binding.matrices.max(1)).max(1);
        let w: Vec<Weights> = planes
            .chunks(per)
            .map(|c| Weights {
                q: c[0].ptr(),
                d: c.get(1).map(|b| b.ptr()).unwrap_or(NULL),
            })
            .collect();
        let side = self.side.as_ref().map(|b| crate::bind::matmul::Side {
            ptr: b.ptr(),
            stride: self.n,
        });
        let extra = crate::bind::matmul::Extra {
            side,
            tail: self.tail.as_ref().map(TailBuffers::operands),
        };
        self.binding
            .kargs_with(&w, &self.act, self.y.ptr(), self.m, self.n, self.k, extra)
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
        let mut outs = vec![&self.y];
        if let Some(t) = &self.tail {
            outs.extend(t.outputs());
        }
        poison(gpu, &outs)
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let (reference, replay) = (self.reference)();
        let mut out: Vec<f32> = match self.binding.out {
            ActFormat::Q8Split => download_split_values(gpu, &self.y, self.m * self.n)?,
            _ => gpu.download(&self.y)?,
        };
        if let Some(t) = &self.tail {
            // The reference holds y, then the step's outputs.
            out.truncate(self.m * self.n);
            out.extend(t.read(gpu, self.m * self.n)?);
        }
        Ok(compare(
            &out[..reference.len()],
            &reference,
            replay.as_deref(),
            contract,
            tol,
        ))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v: Vec<u32> = gpu.download(&self.y)?;
        if let Some(t) = &self.tail {
            for b in t.outputs() {
                v.extend(gpu.download::<u32>(b)?);
            }
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
        self.op_kind
    }
}

/// f32 bits of an f32 slice as u32 words (for uploads of float2 planes).
pub(crate) fn ds_words(ds: &[[f32; 2]]) -> Vec<f32> {
    ds.iter().flat_map(|p| [p[0], p[1]]).collect()
}
