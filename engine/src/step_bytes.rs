//! The bytes one decode step must move: the accounting behind `bench`'s
//! `step_bytes`, `floor_ms` and `floor_pct`.
//!
//! Batch-1 decode is a memory stream: each token's step reads every weight
//! it uses once, the K and V of every position it attends to, and writes the
//! logits. Whatever its kernels do, a step cannot take less than those bytes
//! at the memory's bandwidth; this module counts them. It counts what the
//! forward pass needs, in the form the backend stores it, not what an engine
//! happens to move.
//!
//! Counted for the step of the token at position `pos` (positions
//! `0..pos` already cached):
//! - `matrices`: every projection matrix a one-token step multiplies by, as
//!   the backend reads it (the CUDA engine: the device layout its one-row
//!   launches read, `cuda::step_reads`; the CPU engine: the file's bytes):
//!   Q, K and V (K and V only on layers that own a cache), O, gate, up,
//!   down, the PLE gate and projection, the PLE model projection, the tied
//!   head, and on a MoE model the router and the gate, up and down of the
//!   `n_experts_used` experts a token is routed to (never all of them);
//! - `rows`: one row of the token embedding and one of the PLE table;
//! - `vectors`: every norm weight the step reads (f32), one layer scalar
//!   per layer (f32), on a MoE model the router's input scale and the
//!   chosen experts' scales (f32), and the RoPE inverse frequencies (f64,
//!   one table per attention kind present);
//! - `kv_read`: K and V of every position a layer attends to, in its own
//!   cache or its donor's: `pos + 1` positions on full layers, `min(pos +
//!   1, W)` on sliding ones. A KV-shared layer's read of its donor's cache
//!   counts again: it is a second pass over memory, and at depth the cache
//!   is far larger than L2;
//! - `kv_write`: the step's own K and V on each KV-owning layer;
//! - `logits`: `vocab` f32 written once.
//!
//! Not counted: activations and scratch (a few hundred KB that stay in L2
//! between launches), the token id, the copy of the logits to the host, and
//! what an engine adds on its own account (a second pass over the logits
//! for the softcap, zeroing for split-K, re-reads that L2 does not catch):
//! those are the engine's distance from the floor, which the floor exists
//! to show.

use crate::config::{AttnKind, Gemma4Config};
use crate::model::Model;

/// What one decode step reads and writes apart from the KV cache, and the
/// size of a cached element: the inputs of `StepBytes` for one model and
/// one backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepReads {
    /// Every projection matrix of the step, as the backend reads it.
    pub matrices: u64,
    /// One token-embedding row and one PLE row.
    pub rows: u64,
    /// Norm weights, layer scalars and RoPE tables (`vector_bytes`).
    pub vectors: u64,
    /// Bytes of one cached K or V element (f16: 2; the CPU's f32: 4).
    pub kv_elem: u64,
    /// The logits written (`vocab` x 4).
    pub logits: u64,
}

/// The bytes of one decode step (or the mean over a run of steps), by
/// kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepBytes {
    pub matrices: u64,
    pub rows: u64,
    pub vectors: u64,
    pub kv_read: u64,
    pub kv_write: u64,
    pub logits: u64,
}

impl StepBytes {
    /// Weights used by the step: matrices, gathered rows and vectors.
    pub fn weights(&self) -> u64 {
        self.matrices + self.rows + self.vectors
    }
    /// KV cache traffic: read and written.
    pub fn kv(&self) -> u64 {
        self.kv_read + self.kv_write
    }
    /// Everything the step must move.
    pub fn total(&self) -> u64 {
        self.weights() + self.kv() + self.logits
    }
    /// Milliseconds the step takes at `gbps` GB/s (1e9 bytes per second):
    /// the floor no kernel can beat at that bandwidth.
    pub fn floor_ms(&self, gbps: f64) -> f64 {
        self.total() as f64 / (gbps * 1e9) * 1e3
    }
}

/// Positions layer `l` attends to in the step of the token at `pos`: every
/// one up to `pos` on a full layer, the last `W` on a sliding one (the kind
/// of the cache read, which a KV-shared layer shares with its donor).
pub fn kv_positions(cfg: &Gemma4Config, l: usize, pos: usize) -> usize {
    let src = cfg.layers[l].kv_donor.unwrap_or(l);
    match cfg.layers[src].kind {
        AttnKind::Full => pos + 1,
        AttnKind::Sliding => (pos + 1).min(cfg.sliding_window.max(1)),
    }
}

/// K and V bytes one step at `pos` reads, over every layer.
pub fn kv_read_bytes(cfg: &Gemma4Config, kv_elem: u64, pos: usize) -> u64 {
    (0..cfg.n_layers)
        .map(|l| {
            let src = &cfg.layers[cfg.layers[l].kv_donor.unwrap_or(l)];
            2 * (kv_positions(cfg, l, pos) * src.kv_dim()) as u64 * kv_elem
        })
        .sum()
}

/// K and V bytes one step writes: one position on each KV-owning layer.
pub fn kv_write_bytes(cfg: &Gemma4Config, kv_elem: u64) -> u64 {
    cfg.layers
        .iter()
        .filter(|l| l.owns_kv())
        .map(|l| 2 * l.kv_dim() as u64 * kv_elem)
        .sum()
}

/// Bytes of the vectors a step reads: per layer the input, Q, K (on
/// KV-owning layers), post-attention, FFN, post-FFN and PLE post norms
/// (f32) and the layer scalar (f32), on a MoE model the router's input
/// scale, the three MoE norms and the chosen experts' scales (f32); the
/// output norm and the PLE
/// projection norm; the RoPE inverse frequencies of each attention kind
/// present (f64, `dims / 2` each).
pub fn vector_bytes(cfg: &Gemma4Config) -> u64 {
    let d = cfg.d_model;
    let mut floats = 0usize;
    for l in &cfg.layers {
        floats += 4 * d + l.head_dim + 1;
        if l.owns_kv() {
            floats += l.head_dim;
        }
        if cfg.has_ple() {
            floats += d;
        }
        if let Some(moe) = &cfg.moe {
            // The router's input scale, the three MoE norms and the chosen
            // experts' scales.
            floats += 4 * d + moe.n_experts_used;
        }
    }
    floats += d;
    if cfg.has_ple() {
        floats += cfg.ple_dim;
    }
    let rope: usize = [AttnKind::Sliding, AttnKind::Full]
        .into_iter()
        .filter(|k| cfg.layers.iter().any(|l| l.kind == *k))
        .map(|k| cfg.rope(k).dims / 2 * 8)
        .sum();
    (4 * floats + rope) as u64
}

impl StepReads {
    /// The bytes of the step of the token at `pos`.
    pub fn step(&self, cfg: &Gemma4Config, pos: usize) -> StepBytes {
        StepBytes {
            matrices: self.matrices,
            rows: self.rows,
            vectors: self.vectors,
            kv_read: kv_read_bytes(cfg, self.kv_elem, pos),
            kv_write: kv_write_bytes(cfg, self.kv_elem),
            logits: self.logits,
        }
    }

    /// The mean step of `n` (at least 1) consecutive steps from position
    /// `pos0` (a `tgN` row at depth `pos0`): the KV read grows with the
    /// position, the rest is the same each step. Rounded down to a byte.
    pub fn mean_step(&self, cfg: &Gemma4Config, pos0: usize, n: usize) -> StepBytes {
        let n = n.max(1);
        let kv: u64 = (pos0..pos0 + n)
            .map(|p| kv_read_bytes(cfg, self.kv_elem, p))
            .sum();
        StepBytes {
            kv_read: kv / n as u64,
            ..self.step(cfg, pos0)
        }
    }

    /// What the CPU engine's step reads: the matrices and table rows in
    /// their file bytes (it dequantizes inside each dot product), an f32
    /// cache.
    pub fn of_cpu_model(model: &Model) -> StepReads {
        let cfg = model.config();
        let w = model.weights();
        let bytes = |m: &crate::model::MatRef| (m.n_out * m.row_bytes) as u64;
        let mut matrices = bytes(&w.token_embd);
        for lw in &w.layers {
            matrices += bytes(&lw.attn_q) + bytes(&lw.attn_output);
            matrices += lw.attn_k.as_ref().map_or(0, bytes) + lw.attn_v.as_ref().map_or(0, bytes);
            matrices += bytes(&lw.ffn_gate) + bytes(&lw.ffn_up) + bytes(&lw.ffn_down);
            if let Some(p) = &lw.ple {
                matrices += bytes(&p.inp_gate) + bytes(&p.proj);
            }
            if let (Some(mw), Some(moe)) = (&lw.moe, &cfg.moe) {
                // The router, and the gate, up and down of the chosen experts.
                let expert = |m: &crate::model::ExpertMats| (m.n_out * m.row_bytes) as u64;
                matrices += bytes(&mw.router);
                matrices += moe.n_experts_used as u64
                    * (expert(&mw.gate) + expert(&mw.up) + expert(&mw.down));
            }
        }
        let mut rows = w.token_embd.row_bytes as u64;
        if let Some(p) = &w.ple {
            matrices += bytes(&p.model_proj);
            rows += p.token_embd.row_bytes as u64;
        }
        StepReads {
            matrices,
            rows,
            vectors: vector_bytes(cfg),
            kv_elem: 4,
            logits: 4 * model.vocab_size() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{self, SynthVariant};

    #[test]
    fn sliding_layers_read_at_most_the_window_and_shared_layers_their_donor() {
        let cfg = synth::preset(SynthVariant::E4b);
        let w = cfg.sliding_window;
        let full = cfg.layers.iter().position(|l| l.kind == AttnKind::Full);
        let full = full.expect("a full layer");
        let shared = cfg.layers.iter().position(|l| !l.owns_kv());
        let shared = shared.expect("a KV-shared layer");
        for pos in [0, 1, w - 2, w - 1, w, 5 * w] {
            assert_eq!(kv_positions(&cfg, 0, pos), (pos + 1).min(w), "pos {pos}");
            assert_eq!(kv_positions(&cfg, full, pos), pos + 1, "pos {pos}");
        }
        let donor = cfg.layers[shared].kv_donor.expect("donor");
        assert_eq!(
            kv_positions(&cfg, shared, 3 * w),
            kv_positions(&cfg, donor, 3 * w)
        );
        // Reads grow by one position per full layer past the window.
        let n_full = (0..cfg.n_layers)
            .filter(|&l| cfg.layers[cfg.layers[l].kv_donor.unwrap_or(l)].kind == AttnKind::Full)
            .map(|l| 2 * cfg.layers[cfg.layers[l].kv_donor.unwrap_or(l)].kv_dim() as u64 * 2)
            .sum::<u64>();
        assert_eq!(
            kv_read_bytes(&cfg, 2, 4 * w + 1) - kv_read_bytes(&cfg, 2, 4 * w),
            n_full
        );
    }

    #[test]
    fn the_mean_step_averages_the_kv_read_over_the_run() {
        let cfg = synth::preset(SynthVariant::Tiny);
        let r = StepReads {
            matrices: 10,
            rows: 1,
            vectors: 2,
            kv_elem: 2,
            logits: 8,
        };
        let n = 7;
        let m = r.mean_step(&cfg, 100, n);
        let sum: u64 = (100..100 + n).map(|p| r.step(&cfg, p).kv_read).sum();
        assert_eq!(m.kv_read, sum / n as u64);
        assert_eq!(
            m.total() - m.kv_read,
            r.step(&cfg, 100).total() - r.step(&cfg, 100).kv_read
        );
        assert!((m.floor_ms(1.0) - m.total() as f64 * 1e-6).abs() < 1e-12);
    }
}
