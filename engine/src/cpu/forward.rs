//! The CPU forward pass (`docs/gemma4.md`), batched prefill and single-token
//! decode in one code path: decode is a batch of one.
//!
//! Per batch of T tokens at positions `pos .. pos+T`, the named stages (the
//! CUDA forward in `cuda::forward` has the same ones):
//! - `embed`: `x = E[token] · √d` (dequant-on-gather of one row, f32 scale);
//! - `per_layer_inputs` (E-models): `ple = (RMSNorm_P(W_pl · x / √d) +
//!   E_pl[token] · √P) / √2`, normalised per P-wide chunk, chunk `l` feeding
//!   layer `l`;
//! - per layer: `attention_block` (sandwich-normed attention: q/k norms,
//!   weightless V norm, V never roped, V = raw K projection on k_eq_v layers,
//!   KV-shared layers read their donor's cache and compute no K/V),
//!   `ffn_block` (sandwich-normed gated GELU FFN with the layer's own width;
//!   on a mixture-of-experts model `moe::moe_block`, the shared MLP beside
//!   the routed experts),
//!   `ple_injection` after the FFN residual, and `layer_scale` on the whole
//!   stream;
//! - `head`: final norm, tied head (`token_embd`), softcap — only for the
//!   rows whose logits were asked for (the head is vocab × d).
//!
//! From the first KV-shared layer on (no later layer writes a cache), only the
//! rows whose logits are wanted are carried on (exact, because no
//! later layer's output at one position feeds another position). Prefills
//! longer than `max_batch` are cut into batches of `max_batch` (see `kv_cache`).
//!
//! Batching never changes a result: every matmul output is one fused
//! dequant-dot, norms and RoPE are per row, and attention visits keys in
//! position order, so a prefill of T tokens, any split of it, and T
//! single-token decodes give bit-identical logits.
//!
//! All buffers are sized once for `max_batch` rows and reused across layers
//! and calls; the matmuls and the attention run on rayon's pool.

use std::f32::consts::FRAC_1_SQRT_2;

use gemtune_kernels::quant::{self, QuantError};

use super::attention;
use super::kv_cache::KvCache;
use super::matmul::matmul;
use super::moe::{self, MoeScratch};
use super::ops;
use super::rope;
use crate::config::AttnKind;
use crate::forward::{forward_in_chunks, Chunk, ForwardError, LogitRows, Logits, SeqState};
use crate::model::{MatRef, Model};
use crate::rope::RopeFreqs;
use crate::work::RowWork;

/// Sizing of an engine's cache and buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuOptions {
    /// Most positions the cache holds (capped at the model's context length).
    pub max_seq: usize,
    /// Most tokens per internal batch; longer inputs are cut into batches.
    pub max_batch: usize,
    /// The rows the layers after the last cache-writing layer run.
    pub row_work: RowWork,
}

impl Default for CpuOptions {
    fn default() -> Self {
        CpuOptions {
            max_seq: 4096,
            max_batch: 128,
            row_work: RowWork::Trimmed,
        }
    }
}

/// Per-layer activations recorded for tests and debugging.
#[derive(Clone, Debug, Default)]
pub struct LayerTrace {
    /// Position of each recorded row, in recording order.
    pub positions: Vec<usize>,
    /// `RMSNorm(h, attn_norm)`, `[rows][d]`.
    pub attn_in: Vec<f32>,
    /// Normed, roped queries, `[rows][n_heads·hd]`.
    pub q: Vec<f32>,
    /// Attention output before `attn_output`, `[rows][n_heads·hd]`.
    pub attn: Vec<f32>,
    /// Layer output (residual stream after the layer scalar), `[rows][d]`.
    pub out: Vec<f32>,
}

/// Activations of every layer, appended call after call.
#[derive(Clone, Debug)]
pub struct Trace {
    d: usize,
    q_dims: Vec<usize>,
    pub layers: Vec<LayerTrace>,
}

impl Trace {
    /// An empty trace for a model (the CUDA engine records into the same
    /// structure, so the two can be compared layer by layer).
    pub fn new(cfg: &crate::config::Gemma4Config) -> Trace {
        Trace {
            d: cfg.d_model,
            q_dims: cfg.layers.iter().map(|l| l.q_dim()).collect(),
            layers: vec![LayerTrace::default(); cfg.n_layers],
        }
    }
    fn idx(&self, l: usize, pos: usize) -> Option<usize> {
        self.layers
            .get(l)?
            .positions
            .iter()
            .rposition(|&p| p == pos)
    }
    /// The latest recorded output of layer `l` at `pos`.
    pub fn out(&self, l: usize, pos: usize) -> Option<&[f32]> {
        let i = self.idx(l, pos)?;
        Some(&self.layers[l].out[i * self.d..(i + 1) * self.d])
    }
    /// The latest recorded attention input (normed) of layer `l` at `pos`.
    pub fn attn_in(&self, l: usize, pos: usize) -> Option<&[f32]> {
        let i = self.idx(l, pos)?;
        Some(&self.layers[l].attn_in[i * self.d..(i + 1) * self.d])
    }
    /// The latest recorded normed, roped query of layer `l` at `pos`.
    pub fn q(&self, l: usize, pos: usize) -> Option<&[f32]> {
        let i = self.idx(l, pos)?;
        let w = self.q_dims[l];
        Some(&self.layers[l].q[i * w..(i + 1) * w])
    }
    /// The latest recorded attention output of layer `l` at `pos`.
    pub fn attn(&self, l: usize, pos: usize) -> Option<&[f32]> {
        let i = self.idx(l, pos)?;
        let w = self.q_dims[l];
        Some(&self.layers[l].attn[i * w..(i + 1) * w])
    }
}

/// Buffers for `max_batch` rows, reused by every layer and call.
struct Scratch {
    x: Vec<f32>,
    a: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    o: Vec<f32>,
    y: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    ple: Vec<f32>,
    ple_proj: Vec<f32>,
    pg: Vec<f32>,
    cos_swa: Vec<f32>,
    sin_swa: Vec<f32>,
    cos_full: Vec<f32>,
    sin_full: Vec<f32>,
    /// Chunk-local index of each live row.
    active: Vec<usize>,
    /// Absolute position of each live row.
    qpos: Vec<usize>,
    keep: Vec<usize>,
    /// The MoE block's buffers (MoE models only).
    moe: Option<MoeScratch>,
}

/// Rows each decoder layer ran and rows the head ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RowsRun {
    pub layers: Vec<u64>,
    pub head: u64,
}

/// A CPU inference session: one sequence, its KV cache and buffers.
pub struct CpuEngine<'m> {
    model: &'m Model,
    max_seq: usize,
    max_batch: usize,
    cache: KvCache,
    pos: usize,
    s: Scratch,
    rope_swa: RopeFreqs,
    rope_full: RopeFreqs,
    /// First layer that carries only the rows whose logits are wanted
    /// (`RowWork::compact_from`).
    compact_at: usize,
    /// Rows each layer ran since the engine was made or reset, and rows
    /// the head ran: what tests hold `work::forward_work` to.
    rows_run: RowsRun,
    trace: Option<Trace>,
}

impl<'m> CpuEngine<'m> {
    /// A session for `model`. `max_seq` is capped at the context length.
    pub fn new(model: &'m Model, opts: CpuOptions) -> Result<CpuEngine<'m>, ForwardError> {
        let cfg = model.config();
        let max_seq = opts.max_seq.clamp(1, cfg.context_length.max(1));
        let max_batch = opts.max_batch.clamp(1, max_seq);
        for l in &cfg.layers {
            if l.n_kv_heads == 0 || l.n_heads % l.n_kv_heads != 0 {
                return Err(ForwardError::Config(format!(
                    "layer {}: {} query heads over {} KV heads",
                    l.index, l.n_heads, l.n_kv_heads
                )));
            }
            let rope_dims = cfg.rope(l.kind).dims;
            if rope_dims > l.head_dim || rope_dims % 2 != 0 {
                return Err(ForwardError::Config(format!(
                    "layer {}: rope width {rope_dims} does not fit head dim {}",
                    l.index, l.head_dim
                )));
            }
            if let Some(d) = l.kv_donor {
                let ok = d < l.index
                    && cfg.layers[d].owns_kv()
                    && cfg.layers[d].kind == l.kind
                    && cfg.layers[d].head_dim == l.head_dim
                    && l.n_heads % cfg.layers[d].n_kv_heads == 0;
                if !ok {
                    return Err(ForwardError::Config(format!(
                        "layer {}: KV donor {d} is not an earlier KV-owning layer of the same shape",
                        l.index
                    )));
                }
            }
        }
        let compact_at = opts.row_work.compact_from(cfg);

        let w = cfg.act_widths();
        let (d, qmax, kvmax, ffmax, lp) = (w.d, w.q, w.kv, w.ffn, w.ple_all);
        let rope_swa = RopeFreqs::new(&cfg.rope_swa);
        let rope_full = RopeFreqs::new(&cfg.rope_full);
        let mb = max_batch;
        let s = Scratch {
            x: vec![0.0; mb * d],
            a: vec![0.0; mb * d],
            q: vec![0.0; mb * qmax],
            k: vec![0.0; mb * kvmax],
            v: vec![0.0; mb * kvmax],
            o: vec![0.0; mb * qmax],
            y: vec![0.0; mb * d],
            gate: vec![0.0; mb * ffmax],
            up: vec![0.0; mb * ffmax],
            ple: vec![0.0; mb * lp],
            ple_proj: vec![0.0; mb * lp],
            pg: vec![0.0; mb * cfg.ple_dim],
            cos_swa: vec![0.0; mb * rope_swa.half()],
            sin_swa: vec![0.0; mb * rope_swa.half()],
            cos_full: vec![0.0; mb * rope_full.half()],
            sin_full: vec![0.0; mb * rope_full.half()],
            active: Vec::with_capacity(mb),
            qpos: Vec::with_capacity(mb),
            keep: Vec::with_capacity(mb),
            moe: cfg.moe.as_ref().map(|moe| MoeScratch::new(cfg, moe, mb)),
        };
        Ok(CpuEngine {
            model,
            max_seq,
            max_batch,
            cache: KvCache::new(cfg, max_seq, max_batch),
            pos: 0,
            s,
            rope_swa,
            rope_full,
            compact_at,
            rows_run: RowsRun {
                layers: vec![0; cfg.n_layers],
                head: 0,
            },
            trace: None,
        })
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }
    /// Number of positions already in the cache (the next token's position).
    pub fn position(&self) -> usize {
        self.pos
    }
    pub fn max_seq(&self) -> usize {
        self.max_seq
    }
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }
    pub fn cache(&self) -> &KvCache {
        &self.cache
    }
    /// Mutable cache access (tests perturb cached K/V through this).
    pub fn cache_mut(&mut self) -> &mut KvCache {
        &mut self.cache
    }
    /// Start a new sequence (keeps buffers; clears the trace if enabled
    /// and the rows run).
    pub fn reset(&mut self) {
        self.cache.clear();
        self.pos = 0;
        self.rows_run.layers.fill(0);
        self.rows_run.head = 0;
        if self.trace.is_some() {
            self.enable_trace();
        }
    }
    /// Record every layer's activations from now on (costs copies).
    pub fn enable_trace(&mut self) {
        self.trace = Some(Trace::new(self.model.config()));
    }
    /// Rows each layer and the head ran since the engine was made or reset.
    pub fn rows_run(&self) -> &RowsRun {
        &self.rows_run
    }
    pub fn trace(&self) -> Option<&Trace> {
        self.trace.as_ref()
    }
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take()
    }

    /// Run `tokens` at positions `position() ..`, append their K/V and return
    /// the logits of `rows` (the input checks and the chunk loop are
    /// `forward::forward_in_chunks`, shared with the CUDA engine).
    pub fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Logits, ForwardError> {
        let st = SeqState {
            position: self.pos,
            max_seq: self.max_seq,
            context_length: self.model.config().context_length,
            chunk: self.max_batch,
            vocab: self.model.vocab_size(),
        };
        forward_in_chunks(st, tokens, rows, |c, out| self.run_chunk(c, out))
    }

    /// One batch of at most `max_batch` checked tokens at `position()`: runs
    /// every layer, appends the K/V, advances the position and writes the
    /// logits of the `keep` rows to `out`.
    pub fn run_chunk(&mut self, chunk: Chunk<'_>, out: &mut [f32]) -> Result<(), ForwardError> {
        debug_assert_eq!(chunk.pos, self.pos);
        self.s.keep.clear();
        self.s.keep.extend_from_slice(chunk.keep);
        self.run_batch(chunk.tokens)?;
        let k = self.s.keep.len();
        if k > 0 {
            self.head(k, out)?;
            self.rows_run.head += k as u64;
        }
        self.pos += chunk.tokens.len();
        Ok(())
    }

    /// Final norm, tied head and softcap for the first `k` rows of `x`.
    fn head(&mut self, k: usize, out: &mut [f32]) -> Result<(), ForwardError> {
        let m = self.model;
        let cfg = m.config();
        let w = m.weights();
        let d = cfg.d_model;
        let s = &mut self.s;
        for r in 0..k {
            ops::rms_norm_into(
                &s.x[r * d..(r + 1) * d],
                &w.output_norm,
                cfg.rms_eps,
                &mut s.a[r * d..(r + 1) * d],
            );
        }
        mm(m, &w.token_embd, &s.a[..k * d], k, out)?;
        if let Some(cap) = cfg.final_logit_softcap {
            ops::softcap_row(out, cap);
        }
        Ok(())
    }

    /// Run one batch (at most `max_batch` tokens) through every layer. On
    /// return rows `0..keep.len()` of `x` hold the final hidden states of the
    /// rows listed in `keep` (chunk-local indices, ascending).
    fn run_batch(&mut self, tokens: &[u32]) -> Result<(), ForwardError> {
        let m = self.model;
        let cfg = m.config();
        let w = m.weights();
        let d = cfg.d_model;
        let nt = tokens.len();
        let pos0 = self.pos;
        let Self {
            s,
            cache,
            rope_swa,
            rope_full,
            trace,
            compact_at,
            rows_run,
            ..
        } = self;
        rope_tables(s, rope_swa, rope_full, pos0, nt);
        embed(m, s, tokens)?;
        per_layer_inputs(m, s, tokens)?;
        let lp = cfg.n_layers * cfg.ple_dim;

        s.active.clear();
        s.active.extend(0..nt);
        let mut compacted = false;
        let half = |kind: AttnKind| match kind {
            AttnKind::Sliding => rope_swa.half(),
            AttnKind::Full => rope_full.half(),
        };
        for (l, (lc, lw)) in cfg.layers.iter().zip(&w.layers).enumerate() {
            if l == *compact_at {
                compact(s, d, lp);
                compacted = true;
            }
            if s.active.is_empty() {
                break;
            }
            rows_run.layers[l] += s.active.len() as u64;
            s.qpos.clear();
            s.qpos.extend(s.active.iter().map(|&t| pos0 + t));
            attention_block(m, s, cache, trace.as_mut(), l, lc, lw, half(lc.kind))?;
            match (&lw.moe, s.moe.as_mut()) {
                (Some(mw), Some(ms)) => {
                    let rows = s.active.len();
                    moe::moe_block(m, lw, mw, &mut s.x[..rows * d], rows, ms)?
                }
                _ => ffn_block(m, s, lw, lc.ffn_dim)?,
            }
            ple_injection(m, s, l, lw)?;
            layer_scale(m, s, lw);
            if let Some(tr) = trace.as_mut() {
                let rows = s.active.len();
                tr.layers[l].out.extend_from_slice(&s.x[..rows * d]);
            }
        }
        if !compacted {
            compact(s, d, lp);
        }
        Ok(())
    }
}

/// cos/sin of every position of the batch, per layer kind (shared by all
/// heads and layers of that kind).
fn rope_tables(s: &mut Scratch, swa: &RopeFreqs, full: &RopeFreqs, pos0: usize, nt: usize) {
    let (hs, hf) = (swa.half(), full.half());
    for t in 0..nt {
        swa.fill(
            pos0 + t,
            &mut s.cos_swa[t * hs..(t + 1) * hs],
            &mut s.sin_swa[t * hs..(t + 1) * hs],
        );
        full.fill(
            pos0 + t,
            &mut s.cos_full[t * hf..(t + 1) * hf],
            &mut s.sin_full[t * hf..(t + 1) * hf],
        );
    }
}

/// Embedding: `x = E[token] * sqrt(d)` (dequant-on-gather of one row).
fn embed(m: &Model, s: &mut Scratch, tokens: &[u32]) -> Result<(), ForwardError> {
    let cfg = m.config();
    let w = m.weights();
    let d = cfg.d_model;
    let scale = cfg.embed_scale();
    for (t, &tok) in tokens.iter().enumerate() {
        let xr = &mut s.x[t * d..(t + 1) * d];
        quant::dequantize_row(w.token_embd.ty, m.mat_row(&w.token_embd, tok as usize), xr)?;
        for v in xr.iter_mut() {
            *v *= scale;
        }
    }
    Ok(())
}

/// Per-layer inputs (E-models): `ple = (RMSNorm_P(W_pl x / sqrt(d)) +
/// E_pl[token] sqrt(P)) / sqrt(2)`, normalised per P-wide chunk.
fn per_layer_inputs(m: &Model, s: &mut Scratch, tokens: &[u32]) -> Result<(), ForwardError> {
    let cfg = m.config();
    let Some(pw) = &m.weights().ple else {
        return Ok(());
    };
    let d = cfg.d_model;
    let eps = cfg.rms_eps;
    let nt = tokens.len();
    let pd = cfg.ple_dim;
    let lp = cfg.n_layers * pd;
    mm(
        m,
        &pw.model_proj,
        &s.x[..nt * d],
        nt,
        &mut s.ple_proj[..nt * lp],
    )?;
    let tok_scale = (pd as f32).sqrt();
    let proj_scale = 1.0 / (d as f32).sqrt();
    for (t, &tok) in tokens.iter().enumerate() {
        let row = &mut s.ple[t * lp..(t + 1) * lp];
        quant::dequantize_row(
            pw.token_embd.ty,
            m.mat_row(&pw.token_embd, tok as usize),
            row,
        )?;
        let proj = &mut s.ple_proj[t * lp..(t + 1) * lp];
        for chunk in proj.chunks_exact_mut(pd) {
            for v in chunk.iter_mut() {
                *v *= proj_scale;
            }
            ops::rms_norm_inplace(chunk, Some(&pw.proj_norm), eps);
        }
        for (e, &p) in row.iter_mut().zip(proj.iter()) {
            *e = (p + *e * tok_scale) * FRAC_1_SQRT_2;
        }
    }
    Ok(())
}

/// Attention block of layer `l` over the live rows: pre-attention norm, Q
/// (per-head norm, RoPE), K/V into the cache on KV-owning layers (V is the
/// raw K projection on k_eq_v layers, weightless-normed and never roped),
/// attention over the layer's (or its donor's) cache, the output
/// projection and the sandwich norm on the residual.
#[allow(clippy::too_many_arguments)]
fn attention_block(
    m: &Model,
    s: &mut Scratch,
    cache: &mut KvCache,
    trace: Option<&mut Trace>,
    l: usize,
    lc: &crate::config::LayerConfig,
    lw: &crate::model::LayerWeights,
    half: usize,
) -> Result<(), ForwardError> {
    let cfg = m.config();
    let d = cfg.d_model;
    let eps = cfg.rms_eps;
    let rows = s.active.len();
    let pos0 = s.qpos[0] - s.active[0];
    let hd = lc.head_dim;
    let nq = lc.n_heads;
    let qd = lc.q_dim();
    let (cos, sin) = match lc.kind {
        AttnKind::Sliding => (&s.cos_swa, &s.sin_swa),
        AttnKind::Full => (&s.cos_full, &s.sin_full),
    };
    // Pre-attention norm.
    for r in 0..rows {
        ops::rms_norm_into(
            &s.x[r * d..(r + 1) * d],
            &lw.attn_norm,
            eps,
            &mut s.a[r * d..(r + 1) * d],
        );
    }
    // Q: project, per-head norm, rope.
    mm(m, &lw.attn_q, &s.a[..rows * d], rows, &mut s.q[..rows * qd])?;
    for r in 0..rows {
        let t = s.active[r];
        let (c, sn) = (
            &cos[t * half..(t + 1) * half],
            &sin[t * half..(t + 1) * half],
        );
        for head in s.q[r * qd..(r + 1) * qd].chunks_exact_mut(hd) {
            ops::rms_norm_inplace(head, Some(&lw.attn_q_norm), eps);
            rope::apply(head, c, sn);
        }
    }
    // K/V of layers that own a cache.
    if let (Some(wk), Some(kn), Some(lkv)) = (&lw.attn_k, &lw.attn_k_norm, cache.layer_mut(l)) {
        let kvd = lc.kv_dim();
        mm(m, wk, &s.a[..rows * d], rows, &mut s.k[..rows * kvd])?;
        match &lw.attn_v {
            Some(wv) => mm(m, wv, &s.a[..rows * d], rows, &mut s.v[..rows * kvd])?,
            // k_eq_v: V is the raw K projection, before k_norm and rope.
            None => s.v[..rows * kvd].copy_from_slice(&s.k[..rows * kvd]),
        }
        for r in 0..rows {
            let t = s.active[r];
            let (c, sn) = (
                &cos[t * half..(t + 1) * half],
                &sin[t * half..(t + 1) * half],
            );
            let (kc, vc) = lkv.write_slot(pos0 + t);
            kc.copy_from_slice(&s.k[r * kvd..(r + 1) * kvd]);
            vc.copy_from_slice(&s.v[r * kvd..(r + 1) * kvd]);
            for head in kc.chunks_exact_mut(hd) {
                ops::rms_norm_inplace(head, Some(kn), eps);
                rope::apply(head, c, sn);
            }
            for head in vc.chunks_exact_mut(hd) {
                ops::rms_norm_inplace(head, None, eps);
            }
        }
    }
    // Attention over this layer's cache (the donor's when shared).
    let window = match lc.kind {
        AttnKind::Sliding => Some(cfg.sliding_window),
        AttnKind::Full => None,
    };
    attention::attend(
        &s.q[..rows * qd],
        &s.qpos,
        cache.for_layer(l),
        nq,
        window,
        &mut s.o[..rows * qd],
    );
    if let Some(tr) = trace {
        let lt = &mut tr.layers[l];
        lt.positions.extend_from_slice(&s.qpos);
        lt.attn_in.extend_from_slice(&s.a[..rows * d]);
        lt.q.extend_from_slice(&s.q[..rows * qd]);
        lt.attn.extend_from_slice(&s.o[..rows * qd]);
    }
    mm(
        m,
        &lw.attn_output,
        &s.o[..rows * qd],
        rows,
        &mut s.y[..rows * d],
    )?;
    // Sandwich norm on the attention residual.
    for r in 0..rows {
        ops::add_rms_normed(
            &mut s.x[r * d..(r + 1) * d],
            &s.y[r * d..(r + 1) * d],
            &lw.post_attention_norm,
            eps,
        );
    }
    Ok(())
}

/// FFN block: pre-FFN norm, gated GELU (`down(gelu(gate x) * up x)`) with
/// the layer's own width, and the sandwich norm on the residual.
fn ffn_block(
    m: &Model,
    s: &mut Scratch,
    lw: &crate::model::LayerWeights,
    ff: usize,
) -> Result<(), ForwardError> {
    let cfg = m.config();
    let d = cfg.d_model;
    let eps = cfg.rms_eps;
    let rows = s.active.len();
    for r in 0..rows {
        ops::rms_norm_into(
            &s.x[r * d..(r + 1) * d],
            &lw.ffn_norm,
            eps,
            &mut s.a[r * d..(r + 1) * d],
        );
    }
    mm(
        m,
        &lw.ffn_gate,
        &s.a[..rows * d],
        rows,
        &mut s.gate[..rows * ff],
    )?;
    mm(
        m,
        &lw.ffn_up,
        &s.a[..rows * d],
        rows,
        &mut s.up[..rows * ff],
    )?;
    ops::gelu_mul(&mut s.gate[..rows * ff], &s.up[..rows * ff]);
    mm(
        m,
        &lw.ffn_down,
        &s.gate[..rows * ff],
        rows,
        &mut s.y[..rows * d],
    )?;
    for r in 0..rows {
        ops::add_rms_normed(
            &mut s.x[r * d..(r + 1) * d],
            &s.y[r * d..(r + 1) * d],
            &lw.post_ffw_norm,
            eps,
        );
    }
    Ok(())
}

/// PLE injection (E-models), after the FFN residual:
/// `x += RMSNorm(proj(gelu(inp_gate x) * ple[l]), post_norm)`.
fn ple_injection(
    m: &Model,
    s: &mut Scratch,
    l: usize,
    lw: &crate::model::LayerWeights,
) -> Result<(), ForwardError> {
    let cfg = m.config();
    let d = cfg.d_model;
    let eps = cfg.rms_eps;
    let rows = s.active.len();
    let pd = cfg.ple_dim;
    let lp = cfg.n_layers * pd;
    if let Some(pl) = &lw.ple {
        mm(
            m,
            &pl.inp_gate,
            &s.x[..rows * d],
            rows,
            &mut s.pg[..rows * pd],
        )?;
        for r in 0..rows {
            let g = &mut s.pg[r * pd..(r + 1) * pd];
            ops::gelu_mul(g, &s.ple[r * lp + l * pd..r * lp + (l + 1) * pd]);
        }
        mm(m, &pl.proj, &s.pg[..rows * pd], rows, &mut s.y[..rows * d])?;
        for r in 0..rows {
            ops::add_rms_normed(
                &mut s.x[r * d..(r + 1) * d],
                &s.y[r * d..(r + 1) * d],
                &pl.post_norm,
                eps,
            );
        }
    }
    Ok(())
}

/// The layer scalar multiplies the whole residual stream.
fn layer_scale(m: &Model, s: &mut Scratch, lw: &crate::model::LayerWeights) {
    let d = m.config().d_model;
    let rows = s.active.len();
    if lw.layer_scale != 1.0 {
        for v in s.x[..rows * d].iter_mut() {
            *v *= lw.layer_scale;
        }
    }
}

/// Keep only the rows listed in `s.keep` (a subset of the live rows, both
/// ascending), moving them to the front of `x` and `ple`.
fn compact(s: &mut Scratch, d: usize, lp: usize) {
    let mut out = 0;
    for r in 0..s.active.len() {
        let t = s.active[r];
        if s.keep.binary_search(&t).is_ok() {
            if out != r {
                s.x.copy_within(r * d..(r + 1) * d, out * d);
                if lp > 0 {
                    s.ple.copy_within(r * lp..(r + 1) * lp, out * lp);
                }
            }
            s.active[out] = t;
            out += 1;
        }
    }
    s.active.truncate(out);
}

#[inline]
fn mm(m: &Model, w: &MatRef, x: &[f32], rows: usize, out: &mut [f32]) -> Result<(), QuantError> {
    matmul(w.ty, m.mat_bytes(w), w.n_in, w.n_out, x, rows, out)
}
