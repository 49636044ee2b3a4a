//! The CUDA engine's chunk loop: one chunk of at most `ubatch` tokens
//! through the stages of its bucket's plan, the carried rows compacted to
//! the last one from the first layer that writes no cache, the head on the
//! rows whose logits are wanted; single-token decode steps replay one
//! captured CUDA graph. The input checks and the cutting into chunks are
//! the engine trait's (`crate::forward`), shared with the CPU engine.

use gemtune_kernels::runtime::Kernel;

use super::buffers::HEAD_ROWS;
use super::engine::{dev, plan_err, CudaEngine};
use super::forward_plan::BucketPlan;
use super::stages::Rows;
use crate::engine::{Engine, EngineError, PhaseTimes};
use crate::forward::Chunk;
use crate::model::Model;
use crate::profile::DecodeLaunch;
use crate::step_bytes::StepReads;

impl CudaEngine<'_> {
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

    /// Makes `self.regridded` hold the kernels of the prefill bucket serving
    /// `t` rows at `t` rows' grids, unless `t` is the bucket's bound (then
    /// the loaded kernels serve as they are). Derived once per new chunk
    /// length: the variants stay the planned ones.
    fn regrid(&mut self, t: usize) -> Result<(), EngineError> {
        let b = self.bucket(t)?;
        if b.rows == t || self.regridded.as_ref().is_some_and(|(r, _)| *r == t) {
            return Ok(());
        }
        let ks = self
            .plan
            .kernels_at(&self.kernels, b, t)
            .map_err(plan_err)?;
        self.regridded = Some((t, ks));
        Ok(())
    }

    /// The kernels a chunk of `t` rows launches (after `regrid`).
    fn kernels_for(&self, t: usize, b: &BucketPlan) -> &[Kernel] {
        match &self.regridded {
            Some((r, ks)) if *r == t && b.rows != t => ks,
            _ => &self.kernels.kernels,
        }
    }

    /// One chunk at `self.pos`; `keep` lists the chunk rows whose logits
    /// are wanted (ascending). Returns the rows left in `x` for the head
    /// (None when no logits are wanted).
    fn run_layers(&mut self, tokens: &[u32], keep: &[usize]) -> Result<Option<Rows>, EngineError> {
        let t = tokens.len();
        let carried_last = keep.len() == 1 && keep[0] == t - 1 && t > 1;
        let pos1 = self.pos + if carried_last { t - 1 } else { 0 };
        self.upload_inputs(tokens, pos1)?;
        self.regrid(t)?;
        let n_layers = self.model.config().n_layers;
        let compact_from = self.plan.compact_from;
        let full = self.bucket(t)?;
        let k = self.kernels_for(t, full);
        self.embed(k, full, t)?;
        self.per_layer_inputs(k, full, t)?;
        let mut rows = Rows {
            n: t,
            pos_slot: 0,
            pos0: self.pos,
        };
        // The bucket and kernels of the carried rows: the chunk's, then
        // after compaction the one-row decode bucket's.
        let mut bp = full;
        let mut k = k;
        let mut normed = false;
        for l in 0..n_layers {
            if l == compact_from {
                if keep.is_empty() {
                    return Ok(None);
                }
                if keep.len() < rows.n {
                    rows = self.compact(keep[0], pos1)?;
                    bp = self.bucket(1)?;
                    k = &self.kernels.kernels;
                }
                normed = false;
            }
            let lp = &bp.layers[l];
            if !normed {
                self.input_norm(k, lp, l, rows)?;
            }
            // The layer ends with the next layer's input norm unless the
            // rows are compacted before it.
            let next = (l + 1 < n_layers && l + 1 != compact_from).then(|| &bp.layers[l + 1]);
            self.layer(k, bp, l, rows, next)?;
            normed = next.is_some();
        }
        if keep.is_empty() {
            return Ok(None);
        }
        if compact_from == n_layers && keep.len() < rows.n {
            rows = self.compact(keep[0], pos1)?;
        }
        Ok(Some(rows))
    }

    /// Keeps only row `row` (the last one when only it is wanted).
    fn compact(&self, row: usize, pos1: usize) -> Result<Rows, EngineError> {
        self.copy_row(row)?;
        Ok(Rows {
            n: 1,
            pos_slot: 1,
            pos0: pos1,
        })
    }

    /// One decoder layer over `rows`; `act` holds the layer's normed input.
    fn layer(
        &self,
        k: &[Kernel],
        bp: &BucketPlan,
        l: usize,
        rows: Rows,
        next: Option<&super::forward_plan::LayerPlan>,
    ) -> Result<(), EngineError> {
        let lp = &bp.layers[l];
        self.attention_block(k, lp, l, rows)?;
        if self.trace.borrow().is_some() {
            self.record_trace(l, rows, false)?;
        }
        self.attn_residual(k, lp, l, rows)?;
        // The router reads only the FFN block's input (the attention
        // residual writes it), so it may run before the shared MLP.
        let route_early = lp.moe.as_ref().is_some_and(|m| m.route_early);
        if route_early {
            self.moe_route(k, lp, l, rows)?;
        }
        self.ffn_block(k, lp, l, rows)?;
        if !route_early {
            self.moe_route(k, lp, l, rows)?;
        }
        self.moe_experts(k, lp, l, rows)?;
        self.ple_injection(k, lp, l, rows)?;
        self.layer_end(k, lp, l, rows, next)?;
        if self.trace.borrow().is_some() {
            self.record_trace(l, rows, true)?;
        }
        Ok(())
    }

    /// Appends layer `l`'s queries and attention output (`out` = false) or
    /// its output (the residual stream, `out` = true) for `rows` to the
    /// trace (synchronizes: debugging only).
    fn record_trace(&self, l: usize, rows: Rows, out: bool) -> Result<(), EngineError> {
        let cfg = self.model.config();
        let (d, qd) = (cfg.d_model, cfg.layers[l].q_dim());
        let (x, q, o): (Vec<f32>, Vec<f32>, Vec<f32>) = if out {
            (
                self.gpu.download(&self.b.x).map_err(dev)?,
                Vec::new(),
                Vec::new(),
            )
        } else {
            (
                Vec::new(),
                self.gpu.download(&self.b.q).map_err(dev)?,
                self.gpu.download(&self.b.o).map_err(dev)?,
            )
        };
        let mut tr = self.trace.borrow_mut();
        let Some(tr) = tr.as_mut() else {
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
        *self.trace.get_mut() = Some(crate::cpu::Trace::new(self.model.config()));
    }
    /// A copy of the trace recorded so far.
    pub fn trace(&self) -> Option<crate::cpu::Trace> {
        self.trace.borrow().clone()
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

    /// A single-token decode step through the captured graph (the timed
    /// one while phases are measured).
    fn decode_graph(&mut self, token: u32) -> Result<(), EngineError> {
        self.upload_inputs(&[token], self.pos)?;
        if self.phases.get_mut().is_some() {
            return self.decode_timed_graph();
        }
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

    /// A decode step through the timed graph (`phases`): captured once per
    /// `Phases`, the same launches as the untimed graph with an event-record
    /// node at every phase mark.
    fn decode_timed_graph(&mut self) -> Result<(), EngineError> {
        let captured = self
            .phases
            .get_mut()
            .as_ref()
            .is_some_and(|p| p.has_graph());
        if !captured {
            // Every mark of a step, with room: a layer marks at most 24
            // phases (vendor arms add a conversion before each matmul).
            let expect = 24 * self.model.config().n_layers + 16;
            if let Some(p) = self.phases.get_mut().as_mut() {
                p.begin_capture(&self.gpu, expect).map_err(dev)?;
            }
            self.gpu.begin_capture().map_err(dev)?;
            let body = self
                .decode_body()
                .and_then(|()| match self.phases.borrow_mut().as_mut() {
                    Some(p) => p.close_capture(&self.gpu).map_err(dev),
                    None => Ok(()),
                });
            // End the capture whatever happened, so the stream is usable.
            let g = self.gpu.end_capture();
            let g = match (body, g) {
                (Ok(()), Ok(g)) => Ok(g),
                (Err(e), _) => Err(e),
                (Ok(()), Err(e)) => Err(dev(e)),
            };
            let (keep, result) = match g {
                Ok(g) => (Some(g), Ok(())),
                Err(e) => (None, Err(e)),
            };
            if let Some(p) = self.phases.get_mut().as_mut() {
                p.finish_capture(&self.gpu, keep).map_err(dev)?;
            }
            result?;
        }
        match self.phases.get_mut().as_mut() {
            Some(p) => p.replay(&self.gpu).map_err(dev),
            None => Err(EngineError::Device(
                "phases were turned off during a timed decode step".into(),
            )),
        }
    }

    /// The launches of a one-token decode step (captured once), chained
    /// when the profile asks (`launch_chain`).
    fn decode_body(&self) -> Result<(), EngineError> {
        if self.chains_decode() {
            self.chain.begin();
        }
        let r = self.decode_launches();
        self.chain.end();
        r
    }

    /// Whether this model's decode step is chained (`DecodeLaunch`).
    pub(super) fn chains_decode(&self) -> bool {
        match self.decode_launch {
            DecodeLaunch::Plain => false,
            DecodeLaunch::Chained => true,
            DecodeLaunch::ChainedDense => self.model.config().moe.is_none(),
        }
    }

    /// The one-row bucket, every layer, the head.
    fn decode_launches(&self) -> Result<(), EngineError> {
        let bp = self.bucket(1)?;
        let k = &self.kernels.kernels;
        self.embed(k, bp, 1)?;
        self.per_layer_inputs(k, bp, 1)?;
        let n_layers = self.model.config().n_layers;
        let rows = Rows {
            n: 1,
            pos_slot: 0,
            pos0: self.pos,
        };
        if let Some(lp) = bp.layers.first() {
            self.input_norm(k, lp, 0, rows)?;
        }
        for l in 0..n_layers {
            self.layer(k, bp, l, rows, bp.layers.get(l + 1))?;
        }
        let hp = bp
            .head
            .as_ref()
            .ok_or_else(|| EngineError::Device("the one-row bucket has no head plan".into()))?;
        self.head(k, hp, 0, 1)
    }

    /// The head over `rows` rows of `x`, in passes of at most `HEAD_ROWS`,
    /// each pass's logits copied to `out`.
    fn run_head(&mut self, rows: Rows, out: &mut [f32]) -> Result<(), EngineError> {
        let vocab = self.model.vocab_size();
        let mut r0 = 0;
        while r0 < rows.n {
            let r = (rows.n - r0).min(HEAD_ROWS);
            {
                let hp = self.bucket(r)?.head.as_ref().ok_or_else(|| {
                    EngineError::Device(format!("the {r}-row bucket has no head plan"))
                })?;
                self.head(&self.kernels.kernels, hp, r0, r)?;
            }
            self.read_logits(r, &mut out[r0 * vocab..(r0 + r) * vocab])?;
            r0 += r;
        }
        Ok(())
    }
}

impl Engine for CudaEngine<'_> {
    fn model(&self) -> &Model {
        self.model
    }
    fn backend(&self) -> &'static str {
        "cuda"
    }
    fn position(&self) -> usize {
        self.pos
    }
    fn max_seq(&self) -> usize {
        self.plan.sizing.max_seq
    }
    fn chunk_len(&self) -> usize {
        self.plan.sizing.ubatch
    }
    fn reset(&mut self) {
        self.pos = 0;
    }
    fn run_chunk(&mut self, chunk: Chunk<'_>, out: &mut [f32]) -> Result<(), EngineError> {
        let tokens = chunk.tokens;
        if tokens.len() == 1
            && chunk.keep.len() == 1
            && self.use_graph
            && self.trace.borrow().is_none()
        {
            self.decode_graph(tokens[0])?;
            self.read_logits(1, out)?;
        } else if let Some(rows) = self.run_layers(tokens, chunk.keep)? {
            self.run_head(rows, out)?;
        }
        if let Some(p) = self.phases.get_mut().as_mut() {
            p.collect(&self.gpu).map_err(dev)?;
        }
        self.pos += tokens.len();
        Ok(())
    }
    fn set_phases(&mut self, on: bool) -> bool {
        // Turned off, the timing is parked rather than dropped: its timed
        // decode graph is captured once per engine, not once per request.
        let p = self.phases.get_mut();
        match (on, p.is_some()) {
            (true, false) => *p = Some(self.parked_phases.take().unwrap_or_default()),
            (false, true) => {
                if let Some(mut old) = p.take() {
                    old.take();
                    self.parked_phases = Some(old);
                }
            }
            _ => {}
        }
        true
    }
    fn take_phases(&mut self) -> Option<PhaseTimes> {
        self.phases.get_mut().as_mut().map(|p| p.take())
    }
    fn describe(&self) -> Vec<String> {
        self.describe_lines()
    }
    fn step_reads(&self) -> Option<StepReads> {
        Some(self.step_reads)
    }
    fn conversion_notice(&self) -> Option<String> {
        let c = self.conversions();
        (!c.is_empty()).then(|| {
            format!(
                "converted lossily at load ({} of the model's weights; profile {}): {}",
                c.len(),
                self.planner.profile.name,
                c.join("; ")
            )
        })
    }
}
