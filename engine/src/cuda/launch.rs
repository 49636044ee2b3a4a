//! The stages of the CUDA forward, each a short sequence of launches of
//! planned kernels through the families' `bind` calling conventions.
//!
//! Every buffer is one of `Buffers` (fixed addresses) or a weight; every
//! problem handed to the planner uses only dimensions that shape the launch
//! (token counts, widths, heads), never positions, so one decision serves
//! every call of the same shape and a captured decode graph stays valid.

use gemtune_kernels::bind::attention as battn;
use gemtune_kernels::bind::matmul::{MatmulBinding, Prepass, Weights};
use gemtune_kernels::bind::rows as brows;
use gemtune_kernels::bind::{Act, ActFormat, DevPtr, NULL};
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::{AttnProblem, Problem, RowsProblem};
use gemtune_kernels::gpu::{DeviceBuffer, KArg};
use gemtune_kernels::quant::GgmlType;
use gemtune_kernels::reference::cublas::GemmType;

use super::calls::{self, rows_problem, window};
use super::forward::{Rows, GEMV_MAX_ROWS};
use super::weights::GpuMatrix;
use super::{dev, plan_err, CudaEngine};
use crate::config::{AttnKind, Gemma4Config};
use crate::engine::EngineError;

/// Embedding-table types the `embed` and `ple` kernels read as they are;
/// other types are requantized to Q8_0 at load.
pub const EMBED_TYPES: &[GgmlType] = &[
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::F32,
];

/// Bytes of the split-KV partials the decode attention needs at most.
pub fn attn_scratch_bytes(cfg: &Gemma4Config, max_seq: usize, ubatch: usize) -> usize {
    cfg.layers
        .iter()
        .map(|l| {
            battn::decode_scratch_bytes(&calls::attn_problem(
                cfg,
                l,
                GEMV_MAX_ROWS,
                max_seq,
                ubatch,
                gemtune_kernels::family::KvType::F32,
            ))
        })
        .max()
        .unwrap_or(0)
}

impl CudaEngine<'_> {
    fn attn_problem(&self, l: usize, n_q: usize) -> AttnProblem {
        let cfg = self.model.config();
        calls::attn_problem(
            cfg,
            &cfg.layers[l],
            n_q,
            self.max_seq,
            self.ubatch,
            self.kv.kv_type,
        )
    }

    fn plan_rows_kernel(
        &self,
        slot: &str,
        p: &Problem,
        bound: &[(&str, DefineValue)],
    ) -> Result<super::plan::Planned, EngineError> {
        self.planner
            .plan(&self.gpu, slot, p, bound)
            .map_err(plan_err)
    }

    /// Converts f32 `src` (`[m][k]`, contiguous) into the activation format
    /// `kind`'s GEMM reads at `m` rows, into the `act` buffer; an f32
    /// consumer reads `src` itself.
    fn convert_for(
        &self,
        kind: &str,
        w: &GpuMatrix,
        src: DevPtr,
        m: usize,
    ) -> Result<Act, EngineError> {
        if self.planner.vendor(&super::forward::slot_for(kind, m)) {
            return Ok(Act::f32(src));
        }
        let (pl, b) = self.matmul_kernel(kind, w, m).map_err(plan_err)?;
        let k = w.k;
        let act = self.act(b.act);
        let args = b.prepass_kargs(src, &act, m, k);
        match (b.prepass, args) {
            (Prepass::None, _) | (_, None) => Ok(Act::f32(src)),
            (Prepass::QuantizeQ8_1, Some(args)) => {
                self.mark("act_convert")?;
                let q = self.plan_rows_kernel(
                    "quantize_q8_1",
                    &Problem::matmul(m, 1, k, GgmlType::Q8_0),
                    &[],
                )?;
                q.kernel.launch(&self.gpu, &args).map_err(dev)?;
                Ok(act)
            }
            (Prepass::DqConvert, Some(args)) => {
                self.mark("act_convert")?;
                let conv = pl
                    .kernel
                    .sibling(MatmulBinding::dq_convert_geometry(m, k))
                    .map_err(dev)?;
                conv.launch(&self.gpu, &args).map_err(dev)?;
                Ok(act)
            }
        }
    }

    /// `y = x W^T` for a projection kind at `m` rows (`x` in the format the
    /// planned variant reads).
    fn matmul(
        &self,
        kind: &str,
        phase: &'static str,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        m: usize,
    ) -> Result<(), EngineError> {
        let slot = super::forward::slot_for(kind, m);
        if self.planner.vendor(&slot) {
            return self.vendor_matmul(kind, phase, w, x, y, m);
        }
        if self.planner.row_chunked(&slot) && m > super::plan::GEMV_BLOCK {
            return self.chunked_matmul(kind, phase, w, x, y, m);
        }
        let (pl, b) = self.matmul_kernel(kind, w, m).map_err(plan_err)?;
        self.mark(phase)?;
        if b.zero_output {
            self.gpu.fill_u32_range(y, 0, m * w.n, 0).map_err(dev)?;
        }
        let ws: Vec<Weights> = (0..b.matrices)
            .map(|i| w.weights_from(b.layout, i * w.n / b.matrices))
            .collect::<Result<_, _>>()
            .map_err(dev)?;
        let n = w.n / b.matrices;
        let args = b
            .kargs(&ws, x, y.ptr(), m, n, w.k)
            .map_err(|e| EngineError::Device(format!("{kind}: {e}")))?;
        pl.kernel.launch(&self.gpu, &args).map_err(dev)
    }

    /// A GEMV-served prefill projection: blocks of at most 8 rows, each a
    /// launch on the rows' slices of `x` and `y`.
    fn chunked_matmul(
        &self,
        kind: &str,
        phase: &'static str,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        m: usize,
    ) -> Result<(), EngineError> {
        let blk = super::plan::GEMV_BLOCK;
        self.mark(phase)?;
        let mut r0 = 0;
        while r0 < m {
            let mc = blk.min(m - r0);
            let (pl, b) = self.matmul_kernel(kind, w, mc).map_err(plan_err)?;
            let xs = Act {
                format: x.format,
                data: x.data + (x.format.bytes(r0, w.k)) as u64,
                scales: if x.scales == NULL {
                    NULL
                } else {
                    x.scales + (x.format.scale_bytes(r0, w.k)) as u64
                },
            };
            let ws: Vec<Weights> = (0..b.matrices)
                .map(|i| w.weights_from(b.layout, i * w.n / b.matrices))
                .collect::<Result<_, _>>()
                .map_err(dev)?;
            let n = w.n / b.matrices;
            let args = b
                .kargs(&ws, &xs, y.ptr() + (4 * r0 * n) as u64, mc, n, w.k)
                .map_err(|e| EngineError::Device(format!("{kind}: {e}")))?;
            pl.kernel.launch(&self.gpu, &args).map_err(dev)?;
            r0 += mc;
        }
        Ok(())
    }

    /// The vendor arm: `x` (f32) converted to bf16 by `act_convert`, then
    /// cuBLAS's bf16 GEMM on the weights dequantized at load.
    fn vendor_matmul(
        &self,
        kind: &str,
        phase: &'static str,
        w: &GpuMatrix,
        x: &Act,
        y: &DeviceBuffer,
        m: usize,
    ) -> Result<(), EngineError> {
        let err = |m: String| EngineError::Device(format!("{kind} (cuBLAS): {m}"));
        let cublas = self
            .cublas
            .as_ref()
            .ok_or_else(|| err("cuBLAS was not loaded".into()))?;
        let wb = match w.bf16() {
            Some(wb) if x.format == ActFormat::F32 => wb,
            _ => return Err(err("no bf16 weights, or operands not in f32".into())),
        };
        let p = rows_problem(m, w.k);
        let conv = self.plan_rows_kernel("act_convert", &p, &[])?;
        self.mark("act_convert")?;
        let args = [
            KArg::Ptr(x.data),
            KArg::Ptr(self.b.act16.ptr()),
            KArg::U64((m * w.k) as u64),
        ];
        conv.kernel.launch(&self.gpu, &args).map_err(dev)?;
        self.mark(phase)?;
        cublas
            .gemm_tn(&self.gpu, GemmType::Bf16, m, w.n, w.k, wb, &self.b.act16, y)
            .map_err(|e| err(e.to_string()))
    }

    /// The sandwich-norm kernel: with `add`, `h += rmsnorm(y) * w_add`
    /// (times the layer scalar at `scale`); then, with `out`, the norm of
    /// `h` times `w_out` in `out`'s format.
    #[allow(clippy::too_many_arguments)]
    fn rmsnorm(
        &self,
        h: DevPtr,
        add: Option<(DevPtr, DevPtr)>,
        scale: DevPtr,
        out: Option<(DevPtr, Act)>,
        rows: usize,
        width: usize,
    ) -> Result<(), EngineError> {
        let fmt = out.map(|o| o.1.format).unwrap_or(ActFormat::F32);
        let p = rows_problem(rows, width);
        let bound = calls::norm_bound(fmt, add.is_some(), out.is_some());
        let pl = self.plan_rows_kernel("rmsnorm", &p, &bound)?;
        self.mark("norm")?;
        let a = brows::RmsNormArgs {
            h,
            y: add.map(|a| a.0).unwrap_or(NULL),
            w_add: add.map(|a| a.1).unwrap_or(NULL),
            scale,
            w_out: out.map(|o| o.0).unwrap_or(NULL),
            out: out.map(|o| o.1).unwrap_or(Act::f32(NULL)),
            rows,
            width,
            eps: self.model.config().rms_eps,
        };
        pl.kernel.launch(&self.gpu, &a.kargs()).map_err(dev)
    }
}

/// `x = dequant(E[token]) * sqrt(d)` for the call's `t` tokens.
pub(super) fn embed(e: &CudaEngine<'_>, t: usize) -> Result<(), EngineError> {
    let cfg = e.model.config();
    let p = Problem::Rows(RowsProblem {
        rows: t,
        width: cfg.d_model,
        dtype: e.w.embd.ty,
        aux: 0,
    });
    let pl = e.plan_rows_kernel("embed", &p, &[])?;
    let a = brows::EmbedArgs {
        tokens: e.b.tokens.ptr(),
        table: e.w.embd.buf.ptr(),
        out: e.b.x.ptr(),
        rows: t,
        width: cfg.d_model,
        scale: cfg.embed_scale(),
    };
    pl.kernel.launch(&e.gpu, &a.kargs()).map_err(dev)
}

/// The per-layer inputs of E2B/E4B: the model projection of the scaled
/// embedding, then the `ple` kernel (gather, chunk norm, sum, 1/sqrt 2).
pub(super) fn per_layer_inputs(e: &CudaEngine<'_>, t: usize) -> Result<(), EngineError> {
    let cfg = e.model.config();
    let (Some(mp), Some(table), Some(norm)) = (
        e.w.ple_model_proj.as_ref(),
        e.w.ple_table.as_ref(),
        e.w.ple_proj_norm.as_ref(),
    ) else {
        return Ok(());
    };
    let x = e.convert_for("ple", mp, e.b.x.ptr(), t)?;
    let y = e.b.ple_proj.ptr();
    e.matmul("ple", "gemm_ple", mp, &x, &e.b.ple_proj, t)?;
    let lp = cfg.n_layers * cfg.ple_dim;
    let p = Problem::Rows(RowsProblem {
        rows: t,
        width: lp,
        dtype: table.ty,
        aux: cfg.ple_dim,
    });
    let pl = e.plan_rows_kernel("ple", &p, &[])?;
    e.mark("ple")?;
    let a = brows::PleArgs {
        tokens: e.b.tokens.ptr(),
        table: table.buf.ptr(),
        proj: y,
        proj_norm: norm.ptr(),
        out: e.b.ple.ptr(),
        rows: t,
        n_layers: cfg.n_layers,
        ple_dim: cfg.ple_dim,
        proj_scale: 1.0 / (cfg.d_model as f32).sqrt(),
        tok_scale: (cfg.ple_dim as f32).sqrt(),
        eps: cfg.rms_eps,
    };
    pl.kernel.launch(&e.gpu, &a.kargs()).map_err(dev)
}

/// `act = rmsnorm(x) * attn_norm` for layer `l`, in its QKV GEMM's format.
pub(super) fn input_norm(e: &CudaEngine<'_>, l: usize, rows: Rows) -> Result<(), EngineError> {
    let d = e.model.config().d_model;
    let lw = &e.w.layers[l];
    let fmt = e.act_format("qkv", &lw.qkv, rows.n)?;
    let (x, w) = (e.b.x.ptr(), lw.attn_norm.ptr());
    let out = e.act(fmt);
    e.rmsnorm(x, None, NULL, Some((w, out)), rows.n, d)
}

/// Attention block: QKV projection, Q/K norms with RoPE and the cache
/// write, attention, output projection, and the sandwich norm with the
/// residual add, ending with the FFN input norm in `act`.
pub(super) fn attention_block(e: &CudaEngine<'_>, l: usize, rows: Rows) -> Result<(), EngineError> {
    let cfg = e.model.config();
    let lc = cfg.layers[l].clone();
    let d = cfg.d_model;
    let r = rows.n;
    let lw = &e.w.layers[l];
    let fmt = e.act_format("qkv", &lw.qkv, r)?;
    let x_in = e.act(fmt);
    let qkv_buf = &e.b.qkv;
    e.matmul("qkv", "gemm_qkv", &lw.qkv, &x_in, qkv_buf, r)?;

    // Q/K norms, RoPE, K/V into the cache; Q and O in the formats the
    // planned attention kernel reads and writes (calls::attn_io).
    let attn = e.attn_problem(l, r);
    let slot = calls::attn_slot(&cfg.layers[l], r);
    let o_fmt = e.act_format("o", &lw.o, r)?;
    let io =
        calls::attn_io(&e.planner, slot, &Problem::Attention(attn), o_fmt).map_err(plan_err)?;
    let pl = e.plan_rows_kernel(
        "qk_norm_rope",
        &Problem::Attention(attn),
        &calls::q16_bound(io.q16),
    )?;
    let total = lw.qkv.n;
    let (qd, kvd) = (lc.q_dim(), lc.kv_dim());
    let base = qkv_buf.ptr();
    let cache =
        e.kv.for_layer(l)
            .ok_or_else(|| EngineError::Device(format!("layer {l}: no KV cache to read")))?;
    let owns = e.kv.owns(l);
    let k_in = if owns { base + 4 * qd as u64 } else { NULL };
    let v_in = if !owns {
        NULL
    } else if lc.k_eq_v {
        k_in
    } else {
        base + 4 * (qd + kvd) as u64
    };
    let rope = match lc.kind {
        AttnKind::Sliding => e.w.rope_swa.ptr(),
        AttnKind::Full => e.w.rope_full.ptr(),
    };
    let a = brows::QkNormRopeArgs {
        q_in: base,
        q_stride: total,
        k_in,
        k_stride: total,
        v_in,
        v_stride: total,
        q_norm: lw.q_norm.ptr(),
        k_norm: lw.k_norm.as_ref().map(|b| b.ptr()).unwrap_or(NULL),
        inv_freq: rope,
        pos0: e.b.pos.ptr() + 4 * rows.pos_slot as u64,
        q_out: e.b.q.ptr(),
        k_cache: if owns { cache.k.ptr() } else { NULL },
        v_cache: if owns { cache.v.ptr() } else { NULL },
        capacity: cache.capacity,
        rows: r,
        n_heads: lc.n_heads,
        n_kv_heads: lc.n_kv_heads,
        eps: cfg.rms_eps,
    };
    e.mark("rope_kv")?;
    pl.kernel.launch(&e.gpu, &a.kargs()).map_err(dev)?;

    // Attention over the layer's (or its donor's) cache, its O written
    // straight into the output projection's activation buffer when it
    // can write that format.
    let pl = e.plan_rows_kernel(slot, &Problem::Attention(attn), &calls::out_bound(io.out))?;
    let o_act = (io.out != ActFormat::F32).then(|| e.act(io.out));
    e.mark(match lc.kind {
        AttnKind::Sliding => "attn_swa",
        AttnKind::Full => "attn_full",
    })?;
    let args = battn::AttnArgs {
        q: e.b.q.ptr(),
        k_cache: cache.k.ptr(),
        v_cache: cache.v.ptr(),
        out: o_act.map_or(e.b.o.ptr(), |a| a.data),
        pos0_host: rows.pos0,
        pos0_dev: e.b.pos.ptr() + 4 * rows.pos_slot as u64,
        n_q: r,
        capacity: cache.capacity,
        n_heads: lc.n_heads,
        n_kv_heads: lc.n_kv_heads,
        window: window(cfg, &lc),
        scratch: e.b.attn_scratch.ptr(),
    };
    battn::launch(&pl.kernel, &e.gpu, &attn, &args).map_err(dev)?;

    // Output projection and the sandwich norm.
    let o = match o_act {
        Some(a) => a,
        None => e.convert_for("o", &lw.o, e.b.o.ptr(), r)?,
    };
    let y_buf = &e.b.y;
    e.matmul("o", "gemm_o", &lw.o, &o, y_buf, r)?;
    let fmt = e.act_format("gate_up", &lw.gate_up, r)?;
    let out = e.act(fmt);
    e.rmsnorm(
        e.b.x.ptr(),
        Some((y_buf.ptr(), lw.post_attn_norm.ptr())),
        NULL,
        Some((lw.ffn_norm.ptr(), out)),
        r,
        d,
    )
}

/// FFN block: gate/up (fused), GELU(gate) * up, down; the residual add is
/// done by `ple_injection` together with the layer's tail.
pub(super) fn ffn_block(e: &CudaEngine<'_>, l: usize, rows: Rows) -> Result<(), EngineError> {
    let r = rows.n;
    let lw = &e.w.layers[l];
    let ff = lw.gate_up.n / 2;
    let fmt = e.act_format("gate_up", &lw.gate_up, r)?;
    let x = e.act(fmt);
    // The fused gate+up+GELU GEMV takes the two halves as two matrices.
    let fused = !e.planner.vendor(&super::forward::slot_for("gate_up", r))
        && e.matmul_kernel("gate_up", &lw.gate_up, r)
            .map_err(plan_err)?
            .1
            .matrices
            == 2;
    let down_fmt = e.act_format("down", &lw.down, r)?;
    let h_act = if fused {
        // The fused GEMV writes gelu(gate) * up itself, f32.
        let h = &e.b.h;
        e.matmul("gate_up", "gemm_gate_up", &lw.gate_up, &x, h, r)?;
        e.convert_for("down", &lw.down, h.ptr(), r)?
    } else {
        let gu = &e.b.gu;
        e.matmul("gate_up", "gemm_gate_up", &lw.gate_up, &x, gu, r)?;
        let out = if down_fmt == ActFormat::F32 {
            Act::f32(e.b.h.ptr())
        } else {
            e.act(down_fmt)
        };
        gelu_mul(
            e,
            gu.ptr(),
            2 * ff,
            gu.ptr() + 4 * ff as u64,
            2 * ff,
            out,
            r,
            ff,
        )?;
        out
    };
    let y = &e.b.y;
    e.matmul("down", "gemm_down", &lw.down, &h_act, y, r)
}

#[allow(clippy::too_many_arguments)]
fn gelu_mul(
    e: &CudaEngine<'_>,
    g: DevPtr,
    g_stride: usize,
    u: DevPtr,
    u_stride: usize,
    out: Act,
    rows: usize,
    width: usize,
) -> Result<(), EngineError> {
    let bound = calls::out_bound(out.format);
    let pl = e.plan_rows_kernel("gelu_mul", &rows_problem(rows, width), &bound)?;
    e.mark("gelu")?;
    let a = brows::GeluMulArgs {
        g,
        g_stride,
        u,
        u_stride,
        out,
        rows,
        width,
    };
    pl.kernel.launch(&e.gpu, &a.kargs()).map_err(dev)
}

/// The FFN residual, the PLE injection (E2B/E4B), the layer scalar, and the
/// next layer's input norm (`next_norm`) in its QKV GEMM's format.
pub(super) fn ple_injection(
    e: &CudaEngine<'_>,
    l: usize,
    rows: Rows,
    next_norm: bool,
) -> Result<(), EngineError> {
    let cfg = e.model.config();
    let d = cfg.d_model;
    let r = rows.n;
    let lw = &e.w.layers[l];
    let scale = e.w.layer_scales.ptr() + 4 * l as u64;
    let next = if next_norm {
        let nw = &e.w.layers[l + 1];
        let fmt = e.act_format("qkv", &nw.qkv, r)?;
        Some((nw.attn_norm.ptr(), e.act(fmt)))
    } else {
        None
    };
    let x = e.b.x.ptr();
    let y = &e.b.y;
    let (Some(gate), Some(proj), Some(post)) = (&lw.ple_gate, &lw.ple_proj, &lw.ple_post_norm)
    else {
        return e.rmsnorm(
            x,
            Some((y.ptr(), lw.post_ffw_norm.ptr())),
            scale,
            next,
            r,
            d,
        );
    };
    e.rmsnorm(x, Some((y.ptr(), lw.post_ffw_norm.ptr())), NULL, None, r, d)?;
    let xa = e.convert_for("ple", gate, x, r)?;
    let pg = &e.b.pg;
    e.matmul("ple", "gemm_ple", gate, &xa, pg, r)?;
    let p = cfg.ple_dim;
    let lp = cfg.n_layers * p;
    let fmt = e.act_format("ple", proj, r)?;
    let out = if fmt == ActFormat::F32 {
        Act::f32(e.b.h.ptr())
    } else {
        e.act(fmt)
    };
    gelu_mul(
        e,
        pg.ptr(),
        p,
        e.b.ple.ptr() + 4 * (l * p) as u64,
        lp,
        out,
        r,
        p,
    )?;
    e.matmul("ple", "gemm_ple", proj, &out, y, r)?;
    e.rmsnorm(x, Some((y.ptr(), post.ptr())), scale, next, r, d)
}

/// Moves row `row` of the residual stream (and of the per-layer inputs) to
/// row 0: the only row carried past the compaction point.
pub(super) fn copy_row(
    e: &CudaEngine<'_>,
    row: usize,
) -> Result<(), gemtune_kernels::gpu::GpuError> {
    if row == 0 {
        return Ok(());
    }
    let cfg = e.model.config();
    let d = cfg.d_model;
    e.gpu.copy_range(&e.b.x, 0, &e.b.x, row * d * 4, d * 4)?;
    let lp = cfg.n_layers * cfg.ple_dim;
    if lp > 0 {
        e.gpu
            .copy_range(&e.b.ple, 0, &e.b.ple, row * lp * 4, lp * 4)?;
    }
    Ok(())
}

/// Final norm, tied head and softcap for rows `r0..r0+r` (r <= 8) into
/// logits rows `0..r`.
pub(super) fn head(e: &CudaEngine<'_>, rows: Rows, r0: usize, r: usize) -> Result<(), EngineError> {
    let _ = rows;
    let cfg = e.model.config();
    let d = cfg.d_model;
    let head = &e.w.head;
    let fmt = e.act_format("head", head, r)?;
    let out = e.act(fmt);
    let x = e.b.x.ptr() + (4 * r0 * d) as u64;
    e.rmsnorm(x, None, NULL, Some((e.w.output_norm.ptr(), out)), r, d)?;
    let logits = &e.b.logits;
    e.matmul("head", "head", head, &out, logits, r)?;
    if let Some(cap) = cfg.final_logit_softcap {
        let vocab = e.model.vocab_size();
        let pl = e.plan_rows_kernel("softcap", &rows_problem(r, vocab), &[])?;
        let a = brows::SoftcapArgs {
            x: logits.ptr(),
            rows: r,
            width: vocab,
            cap,
        };
        pl.kernel.launch(&e.gpu, &a.kargs()).map_err(dev)?;
    }
    Ok(())
}
