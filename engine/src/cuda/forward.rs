//! The forward pass of `CudaEngine`, stage by stage as in `cpu::forward`:
//! `embed`, `per_layer_inputs`, then per layer `attention_block`,
//! `ffn_block` and `ple_injection` (which also applies the layer scalar and
//! the next layer's input norm), and `head`.

use gemtune_kernels::bind::matmul::MatmulBinding;
use gemtune_kernels::bind::{Act, ActFormat};
use gemtune_kernels::family::{KvType, Problem};
use gemtune_kernels::gpu::{Gpu, GpuError};
use gemtune_kernels::quant::GgmlType;

use super::launch;
use super::weights::{self, upload_matrix, upload_table, GpuMatrix, Layouts};
use super::{dev, plan_err, CudaEngine, DeviceWeights, LayerWeights, Planner};
use crate::config::{AttnKind, Gemma4Config};
use crate::cpu::rope::RopeFreqs;
use crate::cpu::{ForwardError, LogitRows, Logits};
use crate::engine::EngineError;
use crate::model::{MatRef, Model};

/// Token counts served by the decode GEMV slots (`gemv.*`); more go to the
/// prefill GEMM slots (`gemm.*`).
pub const GEMV_MAX_ROWS: usize = 8;

/// The projection kinds, each a `gemm.<kind>` and a `gemv.<kind>` slot.
pub(super) const KINDS: &[&str] = &["qkv", "o", "gate_up", "down", "ple", "head"];

/// The layouts each projection kind's matrices need, from the bindings of
/// the variants serving its slots at the token counts the engine runs.
pub(super) struct KindLayouts {
    pub by_kind: Vec<(&'static str, Layouts)>,
    /// The tied head reads `token_embd`'s Q6_K blocks, the embedding
    /// table's device copy (`calls::head_type`): no copy of its own.
    pub head_native: bool,
}

impl KindLayouts {
    fn get(&self, kind: &str) -> Layouts {
        self.by_kind
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, l)| *l)
            .unwrap_or_default()
    }
}

/// A representative matrix of each kind (for planning before upload), with
/// the weight type its kernels read.
fn kind_matrix(planner: &Planner, model: &Model, kind: &str) -> Option<(usize, usize, GgmlType)> {
    let w = model.weights();
    let l0 = w.layers.first()?;
    let dims = |m: &MatRef| (m.n_out, m.n_in, weights::device_type(m.ty).ggml());
    Some(match kind {
        "qkv" => dims(&l0.attn_q),
        "o" => dims(&l0.attn_output),
        "gate_up" => {
            let (n, k, t) = dims(&l0.ffn_gate);
            (2 * n, k, t)
        }
        "down" => dims(&l0.ffn_down),
        "ple" => dims(&w.ple.as_ref()?.model_proj),
        "head" => {
            let t = &w.token_embd;
            (
                t.n_out,
                t.n_in,
                super::calls::head_type(planner, t.ty, t.n_out, t.n_in),
            )
        }
        _ => return None,
    })
}

pub(super) fn plan_layouts(
    planner: &Planner,
    cfg: &Gemma4Config,
    model: &Model,
    ubatch: usize,
) -> Result<KindLayouts, super::PlanError> {
    let _ = cfg;
    let mut by_kind = Vec::new();
    let mut head_native = false;
    for &kind in KINDS {
        let mut l = Layouts::default();
        if let Some((n, k, t)) = kind_matrix(planner, model, kind) {
            if kind == "head" {
                head_native = t == GgmlType::Q6K;
            }
            let mut ms: Vec<usize> = (1..=GEMV_MAX_ROWS).collect();
            if kind != "head" {
                ms.extend([16, 64, 512, 2048, 4096, ubatch]);
            }
            for m in ms {
                let slot = slot_for(kind, m);
                if planner.vendor(&slot) {
                    l.bf16 = true;
                    continue;
                }
                let pm = planner.plan_rows(&slot, m);
                let (fam, defines, _) =
                    planner.resolve(&slot, &Problem::matmul(pm, n, k, t), &[])?;
                let b = MatmulBinding::of(fam.name(), &defines).map_err(|msg| {
                    super::PlanError::Slot {
                        slot: slot.clone(),
                        msg,
                    }
                })?;
                l.add(b.layout);
            }
        }
        by_kind.push((kind, l));
    }
    Ok(KindLayouts {
        by_kind,
        head_native,
    })
}

pub(super) fn slot_for(kind: &str, m: usize) -> String {
    if kind == "head" {
        "gemv.head".into()
    } else if m <= GEMV_MAX_ROWS {
        format!("gemv.{kind}")
    } else {
        format!("gemm.{kind}")
    }
}

/// Device bytes the engine will allocate (the fit check).
pub(super) fn planned_bytes(
    cfg: &Gemma4Config,
    model: &Model,
    lay: &KindLayouts,
    max_seq: usize,
    ubatch: usize,
    kv: KvType,
) -> u64 {
    let w = model.weights();
    let mut b = 0u64;
    let mat = |m: &MatRef, kind: &str| weights::planned_bytes(m.ty, m.n_out, m.n_in, lay.get(kind));
    for lw in &w.layers {
        b += mat(&lw.attn_q, "qkv");
        if let Some(k) = &lw.attn_k {
            b += mat(k, "qkv");
        }
        if let Some(v) = &lw.attn_v {
            b += mat(v, "qkv");
        }
        b += mat(&lw.attn_output, "o");
        b += mat(&lw.ffn_gate, "gate_up") + mat(&lw.ffn_up, "gate_up");
        b += mat(&lw.ffn_down, "down");
        if let Some(p) = &lw.ple {
            b += mat(&p.inp_gate, "ple") + mat(&p.proj, "ple");
        }
    }
    b += model.mat_bytes(&w.token_embd).len() as u64;
    if !lay.head_native {
        b += mat(&w.token_embd, "head");
    }
    if let Some(p) = &w.ple {
        b += model.mat_bytes(&p.token_embd).len() as u64 + mat(&p.model_proj, "ple");
    }
    b += super::kv_cache::cache_bytes(cfg, max_seq, ubatch, kv);
    // Activation buffers, with a margin for the driver's own allocations.
    let d = cfg.d_model as u64;
    let ff = cfg.layers.iter().map(|l| l.ffn_dim).max().unwrap_or(0) as u64;
    let q = cfg
        .layers
        .iter()
        .map(|l| l.q_dim() + 2 * l.kv_dim())
        .max()
        .unwrap_or(0) as u64;
    let lp = (cfg.n_layers * cfg.ple_dim) as u64;
    let u = ubatch as u64;
    b += 4 * u * (3 * d + 4 * ff + 3 * q + 2 * lp) + 64 * model.vocab_size() as u64;
    b + (256 << 20)
}

fn f32_buf(gpu: &Gpu, v: &[f32]) -> Result<gemtune_kernels::gpu::DeviceBuffer, GpuError> {
    gpu.upload(v)
}

/// The inverse frequencies of a layer kind in f64 (`cpu::rope::RopeFreqs`,
/// the values the CPU engine rotates with).
fn rope_table(
    gpu: &Gpu,
    cfg: &Gemma4Config,
    kind: AttnKind,
) -> Result<gemtune_kernels::gpu::DeviceBuffer, GpuError> {
    let f = RopeFreqs::new(cfg.rope(kind));
    gpu.upload(&f.inv_freq)
}

pub(super) fn upload_weights(
    gpu: &Gpu,
    model: &Model,
    lay: &KindLayouts,
) -> Result<DeviceWeights, GpuError> {
    let cfg = model.config();
    let w = model.weights();
    let mut layers = Vec::with_capacity(cfg.n_layers);
    let mut converted = Vec::new();
    let mut note = |m: &GpuMatrix| {
        if !m.converted_from.is_empty() {
            converted.push(format!(
                "{} ({}) -> {} planes",
                m.name,
                m.converted_from
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                m.wtype.ggml().name()
            ));
        }
    };
    for (i, lw) in w.layers.iter().enumerate() {
        let mut qkv_parts: Vec<&MatRef> = vec![&lw.attn_q];
        if let Some(k) = &lw.attn_k {
            qkv_parts.push(k);
            if let Some(v) = &lw.attn_v {
                qkv_parts.push(v);
            }
        }
        let qkv = upload_matrix(
            gpu,
            model,
            &format!("blk.{i}.attn_qkv"),
            &qkv_parts,
            lay.get("qkv"),
        )?;
        note(&qkv);
        let o = upload_matrix(
            gpu,
            model,
            &lw.attn_output.name,
            &[&lw.attn_output],
            lay.get("o"),
        )?;
        note(&o);
        let gate_up = upload_matrix(
            gpu,
            model,
            &format!("blk.{i}.ffn_gate_up"),
            &[&lw.ffn_gate, &lw.ffn_up],
            lay.get("gate_up"),
        )?;
        note(&gate_up);
        let down = upload_matrix(
            gpu,
            model,
            &lw.ffn_down.name,
            &[&lw.ffn_down],
            lay.get("down"),
        )?;
        note(&down);
        let (ple_gate, ple_proj, ple_post_norm) = match &lw.ple {
            Some(p) => {
                let g =
                    upload_matrix(gpu, model, &p.inp_gate.name, &[&p.inp_gate], lay.get("ple"))?;
                let pr = upload_matrix(gpu, model, &p.proj.name, &[&p.proj], lay.get("ple"))?;
                note(&g);
                note(&pr);
                (Some(g), Some(pr), Some(f32_buf(gpu, &p.post_norm)?))
            }
            None => (None, None, None),
        };
        layers.push(LayerWeights {
            qkv,
            o,
            gate_up,
            down,
            ple_gate,
            ple_proj,
            attn_norm: f32_buf(gpu, &lw.attn_norm)?,
            q_norm: f32_buf(gpu, &lw.attn_q_norm)?,
            k_norm: lw
                .attn_k_norm
                .as_deref()
                .map(|v| f32_buf(gpu, v))
                .transpose()?,
            post_attn_norm: f32_buf(gpu, &lw.post_attention_norm)?,
            ffn_norm: f32_buf(gpu, &lw.ffn_norm)?,
            post_ffw_norm: f32_buf(gpu, &lw.post_ffw_norm)?,
            ple_post_norm,
        });
    }
    let embd = upload_table(gpu, model, &w.token_embd, launch::EMBED_TYPES)?;
    let head = if lay.head_native {
        if embd.ty != GgmlType::Q6K {
            return Err(GpuError::Other(format!(
                "token_embd: the head was planned on Q6_K blocks, the table is {}",
                embd.ty.name()
            )));
        }
        GpuMatrix::shared_blocks(
            "token_embd (head)",
            w.token_embd.n_out,
            w.token_embd.n_in,
            gemtune_kernels::family::WType::Q6K,
            embd.buf.clone(),
        )?
    } else {
        upload_matrix(
            gpu,
            model,
            "token_embd (head)",
            &[&w.token_embd],
            lay.get("head"),
        )?
    };
    note(&head);
    let (ple_table, ple_model_proj, ple_proj_norm) = match &w.ple {
        Some(p) => {
            let mp = upload_matrix(
                gpu,
                model,
                &p.model_proj.name,
                &[&p.model_proj],
                lay.get("ple"),
            )?;
            note(&mp);
            (
                Some(upload_table(
                    gpu,
                    model,
                    &p.token_embd,
                    launch::EMBED_TYPES,
                )?),
                Some(mp),
                Some(f32_buf(gpu, &p.proj_norm)?),
            )
        }
        None => (None, None, None),
    };
    let scales: Vec<f32> = w.layers.iter().map(|l| l.layer_scale).collect();
    let mut bytes: u64 = layers
        .iter()
        .map(|l| {
            l.qkv.bytes()
                + l.o.bytes()
                + l.gate_up.bytes()
                + l.down.bytes()
                + l.ple_gate.as_ref().map(|m| m.bytes()).unwrap_or(0)
                + l.ple_proj.as_ref().map(|m| m.bytes()).unwrap_or(0)
        })
        .sum();
    bytes += embd.buf.bytes() as u64 + head.bytes();
    bytes += ple_table
        .as_ref()
        .map(|t| t.buf.bytes() as u64)
        .unwrap_or(0);
    bytes += ple_model_proj.as_ref().map(|m| m.bytes()).unwrap_or(0);
    let bf16_bytes = layers
        .iter()
        .map(|l| {
            l.qkv.bf16_bytes() + l.o.bf16_bytes() + l.gate_up.bf16_bytes() + l.down.bf16_bytes()
        })
        .sum::<u64>()
        + ple_model_proj.as_ref().map(|m| m.bf16_bytes()).unwrap_or(0);
    Ok(DeviceWeights {
        layers,
        embd,
        head,
        output_norm: f32_buf(gpu, &w.output_norm)?,
        ple_table,
        ple_model_proj,
        ple_proj_norm,
        layer_scales: f32_buf(gpu, &scales)?,
        rope_swa: rope_table(gpu, cfg, AttnKind::Sliding)?,
        rope_full: rope_table(gpu, cfg, AttnKind::Full)?,
        bytes,
        bf16_bytes,
        converted,
    })
}

/// Where a chunk's rows stand in the layer loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct Rows {
    /// Rows carried.
    pub n: usize,
    /// Index into the device `pos` array of the first row's position.
    pub pos_slot: usize,
    /// Host copy of that position.
    pub pos0: usize,
}

impl CudaEngine<'_> {
    /// The shapes the forward's launches depend on, from the uploaded
    /// weights.
    pub(super) fn dims(&self) -> super::calls::ModelDims {
        let dim = |m: &GpuMatrix| (m.n, m.k, m.wtype.ggml());
        super::calls::ModelDims {
            layers: self
                .w
                .layers
                .iter()
                .map(|l| super::calls::LayerDims {
                    qkv: dim(&l.qkv),
                    o: dim(&l.o),
                    gate_up: dim(&l.gate_up),
                    down: dim(&l.down),
                    ple: l
                        .ple_gate
                        .as_ref()
                        .zip(l.ple_proj.as_ref())
                        .map(|(g, p)| (dim(g), dim(p))),
                })
                .collect(),
            head: dim(&self.w.head),
            ple_model_proj: self.w.ple_model_proj.as_ref().map(dim),
            embd_type: self.w.embd.ty,
            ple_type: self.w.ple_table.as_ref().map(|t| t.ty),
            vocab: self.model.vocab_size(),
        }
    }

    /// Plans every slot the engine launches at `r` rows.
    pub(super) fn plan_rows(&self, r: usize) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let calls = super::calls::slot_calls(
            &self.planner,
            cfg,
            &self.dims(),
            r,
            self.max_seq,
            self.ubatch,
            self.kv.kv_type,
        )
        .map_err(plan_err)?;
        for c in calls {
            self.planner
                .plan(&self.gpu, &c.slot, &c.problem, &c.bound)
                .map_err(plan_err)?;
        }
        Ok(())
    }

    pub(super) fn forward_impl(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
    ) -> Result<Logits, EngineError> {
        let vocab = self.model.vocab_size();
        if tokens.is_empty() {
            return Err(ForwardError::Empty.into());
        }
        if let Some((index, &id)) = tokens
            .iter()
            .enumerate()
            .find(|(_, &t)| t as usize >= vocab)
        {
            return Err(ForwardError::UnknownToken { id, index, vocab }.into());
        }
        let needed = self.pos + tokens.len();
        if needed > self.max_seq {
            return Err(ForwardError::ContextFull {
                needed,
                max: self.max_seq,
                ctx: self.model.config().context_length,
            }
            .into());
        }
        let n = tokens.len();
        let wanted: Vec<usize> = match rows {
            LogitRows::Last => vec![n - 1],
            LogitRows::All => (0..n).collect(),
            LogitRows::None => Vec::new(),
        };
        let pos_start = self.pos;
        let mut data = vec![0.0f32; wanted.len() * vocab];
        let mut done = 0;
        let mut c0 = 0;
        while c0 < n {
            let c1 = (c0 + self.ubatch).min(n);
            let keep: Vec<usize> = wanted
                .iter()
                .filter(|&&i| i >= c0 && i < c1)
                .map(|&i| i - c0)
                .collect();
            let chunk = &tokens[c0..c1];
            let k = keep.len();
            if chunk.len() == 1
                && k == 1
                && self.use_graph
                && self.phases.borrow().is_none()
                && self.trace.is_none()
            {
                self.decode_graph(chunk[0])?;
                self.read_logits(1, &mut data[done * vocab..(done + 1) * vocab])?;
            } else if let Some(rows) = self.run_chunk(chunk, &keep)? {
                // The head runs at most HEAD_ROWS rows per pass.
                let mut r0 = 0;
                while r0 < rows.n {
                    let r = (rows.n - r0).min(super::buffers::HEAD_ROWS);
                    self.mark("head")?;
                    launch::head(self, rows, r0, r)?;
                    let at = (done + r0) * vocab;
                    self.read_logits(r, &mut data[at..at + r * vocab])?;
                    r0 += r;
                }
            }
            if let Some(p) = self.phases.get_mut().as_mut() {
                p.collect(&self.gpu).map_err(dev)?;
            }
            done += k;
            self.pos += c1 - c0;
            c0 = c1;
        }
        Ok(Logits {
            positions: wanted.iter().map(|&i| pos_start + i).collect(),
            vocab,
            data,
        })
    }

    /// Writes the chunk's tokens and positions into device memory. The
    /// staging buffer is page-locked and rewritten only after the previous
    /// call synchronized, so the asynchronous copies never race it.
    fn upload_inputs(&mut self, tokens: &[u32], pos1: usize) -> Result<(), EngineError> {
        let n = tokens.len();
        self.gpu.synchronize().map_err(dev)?;
        {
            let s = self.staging_i32.as_mut_slice();
            s[0] = self.pos as i32;
            s[1] = pos1 as i32;
            for (d, &t) in s[4..4 + n].iter_mut().zip(tokens) {
                *d = t as i32;
            }
        }
        self.gpu
            .write_async_from(&self.b.pos, 0, &self.staging_i32, 0, 4)
            .map_err(dev)?;
        self.gpu
            .write_async_from(&self.b.tokens, 0, &self.staging_i32, 4, n)
            .map_err(dev)
    }

    /// One chunk of at most `ubatch` tokens at `self.pos`; `keep` lists the
    /// chunk rows whose logits are wanted (ascending). Returns the rows left
    /// in `x` for the head (None when no logits are wanted).
    fn run_chunk(&mut self, tokens: &[u32], keep: &[usize]) -> Result<Option<Rows>, EngineError> {
        let t = tokens.len();
        let carried_last = keep.len() == 1 && keep[0] == t - 1 && t > 1;
        let pos1 = self.pos + if carried_last { t - 1 } else { 0 };
        self.upload_inputs(tokens, pos1)?;
        self.mark("embed")?;
        launch::embed(self, t)?;
        if self.w.ple_table.is_some() {
            self.mark("ple")?;
            launch::per_layer_inputs(self, t)?;
        }
        let cfg = self.model.config();
        let mut rows = Rows {
            n: t,
            pos_slot: 0,
            pos0: self.pos,
        };
        let n_layers = cfg.n_layers;
        let mut normed = false;
        for l in 0..n_layers {
            if l == self.compact_at {
                if keep.is_empty() {
                    return Ok(None);
                }
                rows = self.compact(rows, keep, pos1)?;
                normed = false;
            }
            if !normed {
                launch::input_norm(self, l, rows)?;
            }
            // The layer ends with the next layer's input norm unless the
            // rows are compacted before it.
            let next_norm = l + 1 < n_layers && l + 1 != self.compact_at;
            self.layer(l, rows, next_norm)?;
            normed = next_norm;
        }
        if keep.is_empty() {
            return Ok(None);
        }
        if self.compact_at == n_layers {
            rows = self.compact(rows, keep, pos1)?;
        }
        Ok(Some(rows))
    }

    /// Keeps only the rows in `keep` (all rows, or the last one).
    fn compact(&mut self, rows: Rows, keep: &[usize], pos1: usize) -> Result<Rows, EngineError> {
        if keep.len() == rows.n {
            return Ok(rows);
        }
        debug_assert_eq!(keep.len(), 1, "only All and Last are kept");
        launch::copy_row(self, keep[0]).map_err(dev)?;
        Ok(Rows {
            n: 1,
            pos_slot: 1,
            pos0: pos1,
        })
    }

    /// One decoder layer over `rows`; `a` holds the layer's normed input.
    fn layer(&mut self, l: usize, rows: Rows, next_norm: bool) -> Result<(), EngineError> {
        launch::attention_block(self, l, rows)?;
        if self.trace.is_some() {
            self.record_trace(l, rows, false)?;
        }
        launch::ffn_block(self, l, rows)?;
        launch::ple_injection(self, l, rows, next_norm)?;
        if self.trace.is_some() {
            self.record_trace(l, rows, true)?;
        }
        Ok(())
    }

    /// Appends layer `l`'s queries and attention output (`out` = false) or
    /// its output (the residual stream, `out` = true) for `rows` to the
    /// trace (synchronizes: debugging only).
    fn record_trace(&mut self, l: usize, rows: Rows, out: bool) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let (d, qd) = (cfg.d_model, cfg.layers[l].q_dim());
        let x: Vec<f32> = if out {
            self.gpu.download(&self.b.x).map_err(dev)?
        } else {
            Vec::new()
        };
        let (q, o): (Vec<f32>, Vec<f32>) = if out {
            (Vec::new(), Vec::new())
        } else {
            (
                self.gpu.download(&self.b.q).map_err(dev)?,
                self.gpu.download(&self.b.o).map_err(dev)?,
            )
        };
        let Some(tr) = self.trace.as_mut() else {
            return Ok(());
        };
        let lt = &mut tr.layers[l];
        if out {
            lt.out.extend_from_slice(&x[..rows.n * d]);
        } else {
            lt.positions.extend((0..rows.n).map(|i| rows.pos0 + i));
            lt.q.extend_from_slice(&q[..rows.n * qd]);
            lt.attn.extend_from_slice(&o[..rows.n * qd]);
        }
        Ok(())
    }

    /// Records every layer's queries, attention output and output from now
    /// on, in the CPU engine's `Trace` (decode steps then run eagerly).
    pub fn enable_trace(&mut self) {
        self.trace = Some(crate::cpu::Trace::new(self.model.config()));
    }
    pub fn trace(&self) -> Option<&crate::cpu::Trace> {
        self.trace.as_ref()
    }

    /// Copies the first `k` (at most 8) logits rows to `out` through the
    /// page-locked staging buffer; synchronizes the stream.
    fn read_logits(&mut self, k: usize, out: &mut [f32]) -> Result<(), EngineError> {
        let n = k * self.model.vocab_size();
        self.gpu
            .read_async(&self.b.logits, 0, &mut self.staging_logits, n)
            .map_err(dev)?;
        self.gpu.synchronize().map_err(dev)?;
        out[..n].copy_from_slice(&self.staging_logits.as_slice()[..n]);
        Ok(())
    }

    /// A single-token decode step through the captured graph.
    fn decode_graph(&mut self, token: u32) -> Result<(), EngineError> {
        self.upload_inputs(&[token], self.pos)?;
        if self.graph.is_none() {
            self.gpu.begin_capture().map_err(dev)?;
            let body = self.decode_body();
            // End the capture whatever happened, so the stream is usable.
            let g = self.gpu.end_capture();
            body?;
            self.graph = Some(g.map_err(dev)?);
        }
        match &self.graph {
            Some(g) => g.launch().map_err(dev),
            None => Err(EngineError::Device(
                "decode graph missing after capture".into(),
            )),
        }
    }

    /// The launches of a one-token decode step (captured once).
    fn decode_body(&mut self) -> Result<(), EngineError> {
        launch::embed(self, 1)?;
        if self.w.ple_table.is_some() {
            launch::per_layer_inputs(self, 1)?;
        }
        let n_layers = self.model.config().n_layers;
        let rows = Rows {
            n: 1,
            pos_slot: 0,
            pos0: self.pos,
        };
        launch::input_norm(self, 0, rows)?;
        for l in 0..n_layers {
            self.layer(l, rows, l + 1 < n_layers)?;
        }
        launch::head(self, rows, 0, 1)
    }

    pub(super) fn mark(&self, phase: &'static str) -> Result<(), EngineError> {
        if let Some(p) = self.phases.borrow_mut().as_mut() {
            p.mark(&self.gpu, phase).map_err(dev)?;
        }
        Ok(())
    }

    /// The planned kernel and binding of a projection kind at `m` rows.
    pub(super) fn matmul_kernel(
        &self,
        kind: &str,
        w: &GpuMatrix,
        m: usize,
    ) -> Result<(super::plan::Planned, MatmulBinding), super::PlanError> {
        let slot = slot_for(kind, m);
        let m = self.planner.plan_rows(&slot, m);
        let p = Problem::matmul(m, w.n, w.k, w.wtype.ggml());
        let pl = self.planner.plan(&self.gpu, &slot, &p, &[])?;
        let b = MatmulBinding::of(pl.family.name(), &pl.defines)
            .map_err(|msg| super::PlanError::Slot { slot, msg })?;
        Ok((pl, b))
    }

    /// The activation format a projection kind reads at `m` rows (f32 for
    /// the vendor arm, which converts its operand itself).
    pub(super) fn act_format(
        &self,
        kind: &str,
        w: &GpuMatrix,
        m: usize,
    ) -> Result<ActFormat, EngineError> {
        if self.planner.vendor(&slot_for(kind, m)) {
            return Ok(ActFormat::F32);
        }
        Ok(self.matmul_kernel(kind, w, m).map_err(plan_err)?.1.act)
    }

    /// The activation buffer in `format` (main plane and Q8_1 scales).
    pub(super) fn act(&self, format: ActFormat) -> Act {
        Act {
            format,
            data: self.b.act.ptr(),
            scales: if format == ActFormat::Q8_1 {
                self.b.act_scales.ptr()
            } else {
                0
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;
    use crate::profile::Profile;
    use crate::synth::{self, SynthModel, SynthVariant, WeightType};
    use gemtune_kernels::compile::Arch;
    use gemtune_kernels::family::DeviceLimits;

    /// The tiny model with d_model 256 in Q4_0: its embedding is Q6_K, as
    /// in the published Q4_0 files.
    fn tiny_q4_0_d256() -> Model {
        let mut cfg = synth::preset(SynthVariant::Tiny);
        cfg.d_model = 256;
        let bytes = SynthModel::from_config(cfg, WeightType::Q4_0, 5)
            .and_then(|s| s.write_to_vec())
            .expect("synth");
        Model::from_gguf(GgufFile::from_bytes(bytes, "tiny-q4_0-d256").expect("gguf"))
            .expect("load")
    }

    fn planner(profile: Profile) -> Planner {
        Planner::new(profile, None, DeviceLimits::for_arch(Arch(90)))
    }

    #[test]
    fn q6k_head_reads_the_embedding_blocks_and_plans_no_copy() {
        let model = tiny_q4_0_d256();
        let w = model.weights();
        assert_eq!(w.token_embd.ty, GgmlType::Q6K);
        let cfg = model.config();
        let kv = KvType::F16;
        for name in ["q6k-head", "strict"] {
            let p = planner(Profile::load(name).expect("profile"));
            let lay = plan_layouts(&p, cfg, &model, 64).expect("layouts");
            assert!(lay.head_native, "{name}: the Q6_K head is read as it is");
            assert_eq!(
                lay.get("head"),
                Layouts {
                    blocks: true,
                    ..Layouts::default()
                },
                "{name}"
            );
        }
        // main (and the profiles based on it that leave the head alone)
        // reads planes there, so the head is converted to Q8_0 planes and
        // that copy is planned.
        for name in ["main", "dp4a", "cublas"] {
            let p = planner(Profile::load(name).expect("profile"));
            let lay = plan_layouts(&p, cfg, &model, 64).expect("layouts");
            assert!(!lay.head_native, "{name}: the Q6_K head is converted");
            assert!(lay.get("head").planes_f16, "{name}");
        }
        let conv = planner(Profile::load("main").expect("main"));
        let lay_c = plan_layouts(&conv, cfg, &model, 64).expect("layouts");
        let native_p = planner(Profile::load("q6k-head").expect("q6k-head"));
        let lay = plan_layouts(&native_p, cfg, &model, 64).expect("layouts");
        let native = planned_bytes(cfg, &model, &lay, 256, 64, kv);
        let converted = planned_bytes(cfg, &model, &lay_c, 256, 64, kv);
        let head_copy = weights::planned_bytes(
            w.token_embd.ty,
            w.token_embd.n_out,
            w.token_embd.n_in,
            lay_c.get("head"),
        );
        assert!(head_copy > 0);
        assert_eq!(
            converted - native,
            head_copy,
            "the saved copy is the head's planes"
        );
    }

    /// The GPU parity fixture (engine/tests/cuda_parity.rs builds the same
    /// model) runs on the CPU engine: finite logits over a short prefill.
    #[test]
    fn tiny_q4_0_d256_runs_on_the_cpu_engine() {
        let model = tiny_q4_0_d256();
        let mut c = crate::cpu::CpuEngine::new(
            &model,
            crate::cpu::CpuOptions {
                max_seq: 16,
                max_batch: 8,
            },
        )
        .expect("cpu engine");
        let toks: Vec<u32> = (300..310).collect();
        let l = c
            .forward(&toks, crate::cpu::LogitRows::All)
            .expect("forward");
        assert_eq!(l.n_rows(), toks.len());
        assert!((0..l.n_rows()).all(|i| l.row(i).iter().all(|v| v.is_finite())));
    }

    #[test]
    fn q8_0_embedding_keeps_the_converted_head_type() {
        let main = planner(Profile::load("main").expect("main"));
        let native = planner(Profile::load("q6k-head").expect("q6k-head"));
        let (n, k) = (262144, 2560);
        assert_eq!(
            super::super::calls::head_type(&native, GgmlType::Q6K, n, k),
            GgmlType::Q6K
        );
        // main's head slot reads planes: the Q6_K head is requantized.
        assert_eq!(
            super::super::calls::head_type(&main, GgmlType::Q6K, n, k),
            GgmlType::Q8_0
        );
        assert_eq!(
            super::super::calls::head_type(&main, GgmlType::Q8_0, n, k),
            GgmlType::Q8_0
        );
        // An embedding type the kernels do not read at all converts.
        assert_eq!(
            super::super::calls::head_type(&main, GgmlType::F16, n, k),
            GgmlType::Q8_0
        );
    }
}
