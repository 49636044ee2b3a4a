//! The check workload's part of gemv's sandwich-norm tail (TAIL=1): the
//! step's operands on the device, the bytes it moves, and the f64 chain
//! its outputs are compared with (kernels/cuda/sandwich_tail.cuh).

use super::rmsnorm::{norm_out_f64, residual_add_f64};
use super::rows_common::act_replay;
use super::TailBuffers;
use crate::bind::matmul::{tail_scratch_bytes, TailMode};
use crate::bind::ActFormat;
use crate::gpu::{Gpu, GpuError};

/// Bytes the tail moves beyond the product: y read back, the residual read
/// and written, the two norm weights, the normalized output.
pub(super) fn tail_bytes(mode: TailMode, m: usize, n: usize) -> u64 {
    let out = match mode {
        TailMode::None => return 0,
        TailMode::Residual => 0,
        TailMode::Norm(f) => f.bytes(m, n) + f.scale_bytes(m, n),
    };
    (4 * (3 * m * n + 2 * n) + out) as u64
}

/// The step's operand values of a TAIL check (seeded like the rmsnorm
/// family's): the residual `[m][n]`, the two norm weights and the layer
/// scalar.
pub(super) struct TailValues {
    h: Vec<f32>,
    w_add: Vec<f32>,
    w_out: Vec<f32>,
    scale: f32,
}

const TAIL_EPS: f32 = 1e-6;

/// Uploads the step's operands: the residual in and out separately (so a
/// call computes the same step every time), the scratch of `grid` blocks
/// with its arrival counter zeroed.
pub(super) fn tail_operands(
    gpu: &Gpu,
    m: usize,
    n: usize,
    grid: usize,
    format: Option<ActFormat>,
    seed: u64,
) -> Result<(TailBuffers, TailValues), GpuError> {
    use rand::Rng;
    let mut rng = super::rng_for("gemv tail", &[m, n], seed);
    let v = TailValues {
        h: super::random_matrix(&mut rng, m, n),
        w_add: (0..n).map(|_| rng.random_range(0.5f32..1.5)).collect(),
        w_out: (0..n).map(|_| rng.random_range(0.5f32..1.5)).collect(),
        scale: rng.random_range(0.1f32..0.9),
    };
    let f = format.unwrap_or(ActFormat::F32);
    let scratch = gpu.alloc(tail_scratch_bytes(grid, m))?;
    gpu.fill_u32(&scratch, 0)?;
    let t = TailBuffers {
        h_in: gpu.upload(&v.h)?,
        h_out: gpu.alloc(4 * m * n)?,
        w_add: gpu.upload(&v.w_add)?,
        scale: gpu.upload(&[v.scale])?,
        w_out: gpu.upload(&v.w_out)?,
        out: gpu.alloc(f.bytes(m, n).max(4))?,
        out_ds: gpu.alloc(f.scale_bytes(m, n).max(8))?,
        scratch,
        format,
        eps: TAIL_EPS,
    };
    Ok((t, v))
}

/// The step over the product's rows in f64: the updated residual, then
/// the normalized output.
fn tail_f64(y: &[f64], v: &TailValues, m: usize, n: usize, norm: bool) -> (Vec<f64>, Vec<f64>) {
    let mut h: Vec<f64> = v.h.iter().map(|&x| x as f64).collect();
    let mut out = Vec::new();
    for t in 0..m {
        let row = &mut h[t * n..(t + 1) * n];
        residual_add_f64(
            row,
            &y[t * n..(t + 1) * n],
            &v.w_add,
            v.scale as f64,
            TAIL_EPS,
        );
        if norm {
            out.extend(norm_out_f64(row, Some(&v.w_out), TAIL_EPS));
        }
    }
    (h, out)
}

/// `reference` (y's reference and replay) extended by the step's outputs:
/// the reference runs the step on y's f64 reference, the replay on y's
/// replay with the output format's rounding.
pub(super) fn with_tail_reference(
    reference: super::RefFn,
    v: TailValues,
    m: usize,
    n: usize,
    format: Option<ActFormat>,
) -> super::RefFn {
    Box::new(move || {
        let (mut r, replay) = reference();
        let (h, out) = tail_f64(&r, &v, m, n, format.is_some());
        let replay = replay.map(|mut rp| {
            let (h, out) = tail_f64(&rp, &v, m, n, format.is_some());
            rp.extend(h);
            if let Some(f) = format {
                let o: Vec<f32> = out.iter().map(|&x| x as f32).collect();
                rp.extend(act_replay(f, &o).into_iter().map(|x| x as f64));
            }
            rp
        });
        r.extend(h);
        r.extend(out);
        (r, replay)
    })
}
