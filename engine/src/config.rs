//! `Gemma4Config`: the model description derived from GGUF metadata
//! (../shared/gemma4-spec.md §2-4). Everything per layer is resolved here once,
//! so the forward passes never re-derive geometry.

/// Attention type of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttnKind {
    /// Sliding-window attention: causal and `q - k < window`.
    Sliding,
    /// Full causal attention (proportional RoPE with freq factors).
    Full,
}

/// RoPE parameters of one layer type.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// θ base (10 000 for SWA, 1 000 000 for full layers).
    pub freq_base: f32,
    /// Rotated width: pairs are (i, i + dims/2) for i < dims/2.
    pub dims: usize,
    /// Per-pair frequency divisors (`rope_freqs.weight`), full layers only:
    /// θ_i = pos · base^(−2i/dims) / factor_i. `None` = all ones.
    pub freq_factors: Option<Vec<f32>>,
}

/// Fully resolved geometry of one decoder layer.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConfig {
    pub index: usize,
    pub kind: AttnKind,
    pub head_dim: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub ffn_dim: usize,
    /// `Some(d)` when this layer owns no K/V and reads layer `d`'s cache
    /// (the last non-shared layer of the same kind).
    pub kv_donor: Option<usize>,
    /// V is the raw K projection (no `attn_v` tensor on this layer).
    pub k_eq_v: bool,
    /// `blk.N.layer_output_scale.weight` is present (value lives in the weights).
    pub has_layer_scale: bool,
}

impl LayerConfig {
    pub fn owns_kv(&self) -> bool {
        self.kv_donor.is_none()
    }
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
}

/// The whole text decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct Gemma4Config {
    /// `general.name` if present.
    pub name: Option<String>,
    pub d_model: usize,
    pub n_layers: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    /// Sliding window W: SWA layers see keys with `q - k < W`.
    pub sliding_window: usize,
    pub rms_eps: f32,
    /// Width of one per-layer-embedding chunk (256 on E-models, 0 = no PLE).
    pub ple_dim: usize,
    /// Number of trailing layers that reuse a donor's K/V.
    pub n_kv_shared_layers: usize,
    /// Final logit softcap (30.0); `None` disables it.
    pub final_logit_softcap: Option<f32>,
    pub rope_swa: RopeConfig,
    pub rope_full: RopeConfig,
    pub layers: Vec<LayerConfig>,
}

impl Gemma4Config {
    /// Embedding scale applied to token embeddings: f32 sqrt(d_model)
    /// (llama.cpp's convention, spec §3.1).
    pub fn embed_scale(&self) -> f32 {
        (self.d_model as f32).sqrt()
    }
    pub fn has_ple(&self) -> bool {
        self.ple_dim > 0
    }
    /// Index of the first layer that owns no K/V (== n_layers when none share).
    pub fn first_shared_layer(&self) -> usize {
        self.n_layers - self.n_kv_shared_layers
    }
    pub fn rope(&self, kind: AttnKind) -> &RopeConfig {
        match kind {
            AttnKind::Sliding => &self.rope_swa,
            AttnKind::Full => &self.rope_full,
        }
    }
}
