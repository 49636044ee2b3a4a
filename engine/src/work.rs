//! The arithmetic a forward pass does, as both engines run it: the rows
//! each decoder layer processes and the floating-point operations that
//! follow (what `bench` reports as GFLOP per token).
//!
//! Rows: a chunk runs every layer over all its rows up to the first layer
//! from which no layer writes a cache (`Gemma4Config::compact_from`); from
//! there on only the rows whose logits are wanted are carried, since no
//! later position reads the others (a chunk that wants none stops there).
//! That is exact, and it is work other engines do: `RowWork::Full` runs
//! every layer over every row, for comparisons on equal work.
//!
//! FLOPs (one multiply-add = 2): the weight matmuls of the rows each layer
//! runs (Q, K and V on layers that own a cache, V only where it is not the
//! K projection, O, gate, up, down, the per-layer-embedding gate and
//! projection, on MoE models the router and the chosen experts' gate, up
//! and down, and the per-layer model projection of every row), attention
//! as QKᵀ and PV over the keys each query sees (causal; a sliding layer sees
//! at most the window), and the tied head for the rows whose logits are
//! wanted. Norms, RoPE and elementwise work are left out (a fraction of a
//! percent of the total). Masked-out keys that a kernel computes anyway are
//! not counted: this is the work the model needs, the usual convention for
//! attention rates.

use crate::config::{AttnKind, Gemma4Config};
use crate::forward::LogitRows;

/// Which rows the layers from `Gemma4Config::compact_from` run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RowWork {
    /// Only the rows whose logits are wanted (the engines' default).
    #[default]
    Trimmed,
    /// Every row through every layer, as engines without the trim do.
    Full,
}

impl RowWork {
    /// The first layer that carries only the wanted rows (`n_layers`:
    /// none does).
    pub fn compact_from(self, cfg: &Gemma4Config) -> usize {
        match self {
            RowWork::Trimmed => cfg.compact_from(),
            RowWork::Full => cfg.n_layers,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            RowWork::Trimmed => "trimmed",
            RowWork::Full => "full",
        }
    }
}

/// The work of one forward call.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassWork {
    /// Rows each decoder layer ran, summed over the chunks.
    pub layer_rows: Vec<u64>,
    /// Rows the LM head ran (the logits wanted).
    pub head_rows: u64,
    /// FLOPs of the weight matmuls of the layers and of the per-layer
    /// model projection.
    pub matmul_flop: f64,
    /// FLOPs of QKᵀ and PV.
    pub attention_flop: f64,
    /// FLOPs of the tied head.
    pub head_flop: f64,
}

impl PassWork {
    pub fn total_flop(&self) -> f64 {
        self.matmul_flop + self.attention_flop + self.head_flop
    }
    /// GFLOP per token of a call over `tokens` tokens.
    pub fn gflop_per_token(&self, tokens: usize) -> f64 {
        self.total_flop() / 1e9 / tokens.max(1) as f64
    }
    fn add(&mut self, o: &PassWork) {
        if self.layer_rows.len() < o.layer_rows.len() {
            self.layer_rows.resize(o.layer_rows.len(), 0);
        }
        for (a, b) in self.layer_rows.iter_mut().zip(&o.layer_rows) {
            *a += b;
        }
        self.head_rows += o.head_rows;
        self.matmul_flop += o.matmul_flop;
        self.attention_flop += o.attention_flop;
        self.head_flop += o.head_flop;
    }
}

/// Weight elements one row multiplies on layer `l` (every matmul of the
/// layer, per-layer-embedding included).
fn layer_weight_elements(cfg: &Gemma4Config, l: usize) -> u64 {
    let lc = &cfg.layers[l];
    let d = cfg.d_model as u64;
    let (q, kv, ff, p) = (
        lc.q_dim() as u64,
        lc.kv_dim() as u64,
        lc.ffn_dim as u64,
        cfg.ple_dim as u64,
    );
    let kv_mats = match (lc.owns_kv(), lc.k_eq_v) {
        (false, _) => 0,
        (true, true) => 1,
        (true, false) => 2,
    };
    // MoE layers: the dense shared MLP (`ffn_dim`) beside the router and
    // the experts a row is routed to (each row multiplies its own chosen
    // experts; grouping rows by expert saves bytes, not arithmetic).
    let moe = cfg.moe.as_ref().map_or(0, |m| {
        d * m.n_experts as u64 + m.n_experts_used as u64 * 3 * d * m.expert_ffn_dim as u64
    });
    d * q + kv_mats * d * kv + q * d + 3 * d * ff + 2 * d * p + moe
}

/// Keys a query at position `pos` sees on a layer of `kind`.
fn keys_seen(cfg: &Gemma4Config, kind: AttnKind, pos: usize) -> u64 {
    let n = pos as u64 + 1;
    match kind {
        AttnKind::Full => n,
        AttnKind::Sliding => n.min(cfg.sliding_window.max(1) as u64),
    }
}

/// The work of one chunk: `positions` are the chunk's rows (ascending),
/// `keep` the chunk-local rows whose logits are wanted.
fn chunk_work(
    cfg: &Gemma4Config,
    pos0: usize,
    len: usize,
    keep: &[usize],
    compact_from: usize,
) -> PassWork {
    let mut w = PassWork {
        layer_rows: vec![0; cfg.n_layers],
        ..PassWork::default()
    };
    let d = cfg.d_model as f64;
    // The per-layer model projection runs on every row before the layers.
    w.matmul_flop += 2.0 * d * (cfg.n_layers * cfg.ple_dim) as f64 * len as f64;
    let all: Vec<usize> = (0..len).collect();
    for l in 0..cfg.n_layers {
        let rows: &[usize] = if l < compact_from { &all } else { keep };
        if rows.is_empty() {
            break;
        }
        let lc = &cfg.layers[l];
        w.layer_rows[l] = rows.len() as u64;
        w.matmul_flop += 2.0 * layer_weight_elements(cfg, l) as f64 * rows.len() as f64;
        let per_key = 4.0 * (lc.n_heads * lc.head_dim) as f64;
        let keys: u64 = rows
            .iter()
            .map(|&r| keys_seen(cfg, lc.kind, pos0 + r))
            .sum();
        w.attention_flop += per_key * keys as f64;
    }
    w.head_rows = keep.len() as u64;
    w.head_flop = 2.0 * d * cfg.vocab_size as f64 * keep.len() as f64;
    w
}

/// The work of a forward call of `n` tokens from position `pos0`, fed in
/// chunks of at most `chunk` tokens (as `forward::forward_in_chunks` cuts
/// them), with the logits of `rows` wanted and rows trimmed per `row_work`.
pub fn forward_work(
    cfg: &Gemma4Config,
    pos0: usize,
    n: usize,
    chunk: usize,
    rows: LogitRows,
    row_work: RowWork,
) -> PassWork {
    let compact_from = row_work.compact_from(cfg);
    let chunk = chunk.max(1);
    let mut total = PassWork {
        layer_rows: vec![0; cfg.n_layers],
        ..PassWork::default()
    };
    let mut c0 = 0;
    while c0 < n {
        let c1 = (c0 + chunk).min(n);
        let keep: Vec<usize> = match rows {
            LogitRows::All => (0..c1 - c0).collect(),
            LogitRows::Last if c1 == n => vec![c1 - c0 - 1],
            LogitRows::Last | LogitRows::None => Vec::new(),
        };
        total.add(&chunk_work(cfg, pos0 + c0, c1 - c0, &keep, compact_from));
        c0 = c1;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{self, SynthVariant};

    fn cfg(v: SynthVariant) -> Gemma4Config {
        synth::preset(v)
    }

    #[test]
    fn trimmed_rows_stop_at_the_first_layer_without_a_cache() {
        let c = cfg(SynthVariant::E4b);
        let from = c.compact_from();
        assert!(from < c.n_layers, "E4B shares KV from layer {from}");
        // Two chunks of 512 and 488, the last row wanted.
        let w = forward_work(&c, 0, 1000, 512, LogitRows::Last, RowWork::Trimmed);
        for (l, &r) in w.layer_rows.iter().enumerate() {
            assert_eq!(r, if l < from { 1000 } else { 1 }, "layer {l}");
        }
        assert_eq!(w.head_rows, 1);
        let full = forward_work(&c, 0, 1000, 512, LogitRows::Last, RowWork::Full);
        assert!(full.layer_rows.iter().all(|&r| r == 1000));
        assert_eq!(full.head_rows, 1);
        assert!(full.total_flop() > w.total_flop());
        // A model where every layer owns its cache runs every row either way.
        let c = cfg(SynthVariant::B31);
        let a = forward_work(&c, 0, 300, 128, LogitRows::Last, RowWork::Trimmed);
        let b = forward_work(&c, 0, 300, 128, LogitRows::Last, RowWork::Full);
        assert_eq!(a, b);
    }

    #[test]
    fn decode_step_flops_are_twice_the_weights_it_reads_plus_attention() {
        let c = cfg(SynthVariant::E4b);
        let w = forward_work(&c, 0, 1, 1, LogitRows::Last, RowWork::Trimmed);
        let d = c.d_model as f64;
        let mut weights = (c.n_layers * c.ple_dim) as f64 * d;
        for l in 0..c.n_layers {
            weights += layer_weight_elements(&c, l) as f64;
        }
        assert_eq!(w.matmul_flop, 2.0 * weights);
        assert_eq!(w.head_flop, 2.0 * d * c.vocab_size as f64);
        // Position 0 sees one key on every layer.
        let attn: f64 = c
            .layers
            .iter()
            .map(|l| 4.0 * (l.n_heads * l.head_dim) as f64)
            .sum();
        assert_eq!(w.attention_flop, attn);
    }

    #[test]
    fn attention_counts_causal_keys_and_caps_sliding_layers_at_the_window() {
        let c = cfg(SynthVariant::E4b);
        let win = c.sliding_window;
        let n = 3 * win;
        let w = forward_work(&c, 0, n, n, LogitRows::All, RowWork::Full);
        let full_keys = (n * (n + 1) / 2) as f64;
        let swa_keys = (win * (win + 1) / 2 + (n - win) * win) as f64;
        let want: f64 = c
            .layers
            .iter()
            .map(|l| {
                let keys = match l.kind {
                    AttnKind::Full => full_keys,
                    AttnKind::Sliding => swa_keys,
                };
                4.0 * (l.n_heads * l.head_dim) as f64 * keys
            })
            .sum();
        assert_eq!(w.attention_flop, want);
        // Chunking moves no work on LogitRows::All.
        let chunked = forward_work(&c, 0, n, 100, LogitRows::All, RowWork::Full);
        assert_eq!(chunked.attention_flop, want);
        assert_eq!(chunked.matmul_flop, w.matmul_flop);
    }

    #[test]
    fn moe_layers_count_the_router_and_the_chosen_experts_only() {
        let c = cfg(SynthVariant::B26A4b);
        let m = c.moe.expect("26B-A4B is a MoE model");
        let w = forward_work(&c, 0, 1, 1, LogitRows::Last, RowWork::Trimmed);
        let mut dense = c.clone();
        dense.moe = None;
        let wd = forward_work(&dense, 0, 1, 1, LogitRows::Last, RowWork::Trimmed);
        let per_layer =
            (c.d_model * m.n_experts + m.n_experts_used * 3 * c.d_model * m.expert_ffn_dim) as f64;
        assert_eq!(
            w.matmul_flop - wd.matmul_flop,
            2.0 * per_layer * c.n_layers as f64
        );
        assert_eq!(
            (m.n_experts, m.n_experts_used, m.expert_ffn_dim),
            (128, 8, 704)
        );
    }

    #[test]
    fn a_call_that_wants_no_logits_stops_at_the_trim() {
        let c = cfg(SynthVariant::E2b);
        let from = c.compact_from();
        let w = forward_work(&c, 0, 64, 64, LogitRows::None, RowWork::Trimmed);
        assert!(w.layer_rows[..from].iter().all(|&r| r == 64));
        assert!(w.layer_rows[from..].iter().all(|&r| r == 0));
        assert_eq!((w.head_rows, w.head_flop), (0, 0.0));
    }
}
