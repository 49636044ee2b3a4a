//! `Gemma4Config`: the model description derived from GGUF metadata
//! (docs/gemma4.md §2-4). Everything per layer is resolved here once,
//! so the forward passes never re-derive geometry.

/// Attention type of one decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
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

/// The mixture-of-experts FFN of a MoE model (26B-A4B): on every layer a
/// router picks `n_experts_used` of `n_experts` gated-GELU experts per
/// token, beside the layer's dense shared MLP (`LayerConfig::ffn_dim`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    /// Experts per layer (`{arch}.expert_count`).
    pub n_experts: usize,
    /// Experts each token is routed to (`{arch}.expert_used_count`).
    pub n_experts_used: usize,
    /// Hidden width of one expert (`{arch}.expert_feed_forward_length`).
    pub expert_ffn_dim: usize,
    /// The experts' gate and up projections are one tensor,
    /// `ffn_gate_up_exps` (gate rows first, then up), as current llama.cpp
    /// conversions write them; `false`: two tensors, `ffn_gate_exps` and
    /// `ffn_up_exps`, as older files have them.
    pub gate_up_fused: bool,
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
    /// `Some` on a mixture-of-experts model: every layer's FFN block is the
    /// MoE block (shared MLP plus routed experts).
    pub moe: Option<MoeConfig>,
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
    /// The first layer from which no layer writes a cache: from there on a
    /// chunk's rows feed no later position, so both engines carry only the
    /// rows whose logits are wanted (`n_layers` when every layer owns its
    /// K/V).
    pub fn compact_from(&self) -> usize {
        (0..=self.n_layers)
            .rev()
            .take_while(|&l| l == self.n_layers || !self.layers[l].owns_kv())
            .last()
            .unwrap_or(self.n_layers)
    }
    /// Slots of layer `l`'s K/V cache (its donor's on KV-shared layers) for
    /// a sequence of at most `max_seq` positions fed in chunks of at most
    /// `chunk` tokens: a full layer keeps every position; a sliding layer a
    /// ring of `window + chunk - 1` (a chunk writes all its keys before it
    /// attends, and its first query still needs the `window - 1` keys before
    /// the chunk), never more than `max_seq`.
    pub fn cache_capacity(&self, l: usize, max_seq: usize, chunk: usize) -> usize {
        let src = &self.layers[self.layers[l].kv_donor.unwrap_or(l)];
        let (max_seq, chunk) = (max_seq.max(1), chunk.max(1));
        match src.kind {
            AttnKind::Full => max_seq,
            AttnKind::Sliding => (self.sliding_window.max(1) + chunk - 1).min(max_seq),
        }
    }
    /// The widest row of each activation: the one sizing of the CPU
    /// engine's scratch, the CUDA engine's buffers and its fit check.
    pub fn act_widths(&self) -> ActWidths {
        let max = |f: &dyn Fn(&LayerConfig) -> usize| self.layers.iter().map(f).max().unwrap_or(0);
        ActWidths {
            d: self.d_model,
            q: max(&|l| l.q_dim()),
            kv: max(&|l| l.kv_dim()),
            qkv: max(&|l| l.q_dim() + 2 * l.kv_dim()),
            ffn: max(&|l| l.ffn_dim),
            ple: self.ple_dim,
            ple_all: self.n_layers * self.ple_dim,
        }
    }
}

/// The widest row of each activation of a model (`Gemma4Config::act_widths`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActWidths {
    /// The residual stream, `d_model`.
    pub d: usize,
    /// Queries and attention outputs, `n_heads * head_dim`.
    pub q: usize,
    /// One of K or V, `n_kv_heads * head_dim`.
    pub kv: usize,
    /// The fused Q|K|V projection output.
    pub qkv: usize,
    /// The FFN's hidden width (gate or up alone).
    pub ffn: usize,
    /// One layer's per-layer-input chunk (0 without PLE).
    pub ple: usize,
    /// Every layer's per-layer inputs together, `n_layers * ple_dim`.
    pub ple_all: usize,
}

impl ActWidths {
    /// The widest input any projection reads (the activation buffer's row).
    pub fn widest_input(&self) -> usize {
        self.d.max(self.q).max(self.ffn).max(self.ple).max(32)
    }
}

/// Why a GGUF file does not describe a usable Gemma 4 text decoder.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ConfigErrorKind {
    #[error("missing required key")]
    MissingKey,
    #[error("expected {expected}, found {found}")]
    WrongType {
        expected: &'static str,
        found: String,
    },
    #[error("array has {found} elements, expected {expected} (one per layer)")]
    WrongLength { expected: usize, found: usize },
    #[error("{0}")]
    InvalidValue(String),
    #[error("architecture is '{0}', expected 'gemma4'")]
    WrongArchitecture(String),
    #[error("layer {layer} shares KV but no earlier non-shared {kind} layer exists to donate it")]
    NoDonor { layer: usize, kind: &'static str },
    #[error("missing tensor")]
    MissingTensor,
    #[error("shape {found:?} disagrees with the config: expected {expected:?} (ggml ne order)")]
    TensorShape { expected: Vec<u64>, found: Vec<u64> },
    #[error("tensor type {0} has no CPU dequantization")]
    UnsupportedType(String),
    #[error("unexpected tensor(s) for this gemma4 config: {}", .0.join(", "))]
    UnexpectedTensors(Vec<String>),
    #[error("cannot read tensor data: {0}")]
    Data(String),
}

/// A config error with its place: Display is `<file>: <item>: <reason>`,
/// e.g. `m.gguf: key 'gemma4.block_count': expected an unsigned integer, found string`.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{}: {item}: {kind}", file.display())]
pub struct ConfigError {
    /// Path of the file (or the label of an in-memory file).
    pub file: std::path::PathBuf,
    /// What is wrong: `key '...'`, `tensor '...'` or `layer N`.
    pub item: String,
    pub kind: ConfigErrorKind,
}

impl ConfigError {
    pub fn new(
        file: impl Into<std::path::PathBuf>,
        item: impl Into<String>,
        kind: ConfigErrorKind,
    ) -> Self {
        ConfigError {
            file: file.into(),
            item: item.into(),
            kind,
        }
    }
}

impl AttnKind {
    /// "swa" or "full".
    pub fn short_name(self) -> &'static str {
        match self {
            AttnKind::Sliding => "swa",
            AttnKind::Full => "full",
        }
    }
}

/// KV donors of every layer: the trailing `n_shared` layers read the cache
/// of the last non-shared layer of the same kind (HF's rule, which does not
/// assume llama.cpp's "full last, SWA just before it" ordering).
/// `Err(layer)` names a shared layer whose kind has no non-shared layer.
pub fn resolve_kv_donors(kinds: &[AttnKind], n_shared: usize) -> Result<Vec<Option<usize>>, usize> {
    let first_shared = kinds.len().saturating_sub(n_shared);
    let mut donors = vec![None; kinds.len()];
    for (i, kind) in kinds.iter().enumerate().skip(first_shared) {
        let donor = (0..first_shared).rev().find(|&j| kinds[j] == *kind);
        donors[i] = Some(donor.ok_or(i)?);
    }
    Ok(donors)
}

/// RoPE frequency factors as the converter writes them for proportional
/// RoPE (partial factor 0.25): `head_dim/8` ones, then 1e30 (no rotation)
/// up to `head_dim/2` entries.
pub fn proportional_rope_factors(head_dim: usize) -> Vec<f32> {
    let half = head_dim / 2;
    let active = head_dim / 8;
    (0..half)
        .map(|i| if i < active { 1.0 } else { 1e30 })
        .collect()
}

// ---------------------------------------------------------------------------
// Parsing from GGUF metadata (spec §4.1).

use crate::gguf::{GgufFile, GgufValue};

const ARCH: &str = "gemma4";

/// Typed metadata access that turns every problem into a `ConfigError`
/// naming the file and the key.
struct Meta<'a> {
    f: &'a GgufFile,
}

fn key_item(key: &str) -> String {
    format!("key '{key}'")
}

fn describe(v: &GgufValue) -> String {
    match v {
        GgufValue::Array(a) => format!("array of {} ({} elements)", a.elem_type.name(), a.len()),
        GgufValue::I8(_) | GgufValue::I16(_) | GgufValue::I32(_) | GgufValue::I64(_) => {
            match v.as_i64() {
                Some(n) if n < 0 => format!("{} {n}", v.type_name()),
                _ => v.type_name().to_string(),
            }
        }
        _ => v.type_name().to_string(),
    }
}

impl<'a> Meta<'a> {
    fn err(&self, key: &str, kind: ConfigErrorKind) -> ConfigError {
        ConfigError::new(self.f.path(), key_item(key), kind)
    }

    fn required(&self, key: &str) -> Result<&'a GgufValue, ConfigError> {
        self.f
            .get(key)
            .ok_or_else(|| self.err(key, ConfigErrorKind::MissingKey))
    }

    fn wrong(&self, key: &str, expected: &'static str, v: &GgufValue) -> ConfigError {
        self.err(
            key,
            ConfigErrorKind::WrongType {
                expected,
                found: describe(v),
            },
        )
    }

    fn uint_of(&self, key: &str, v: &GgufValue) -> Result<usize, ConfigError> {
        v.as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.wrong(key, "an unsigned integer", v))
    }

    fn uint(&self, key: &str) -> Result<usize, ConfigError> {
        let v = self.required(key)?;
        self.uint_of(key, v)
    }

    fn opt_uint(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        self.f.get(key).map(|v| self.uint_of(key, v)).transpose()
    }

    fn float_of(&self, key: &str, v: &GgufValue) -> Result<f32, ConfigError> {
        v.as_f32().ok_or_else(|| self.wrong(key, "a float", v))
    }

    fn float(&self, key: &str) -> Result<f32, ConfigError> {
        let v = self.required(key)?;
        self.float_of(key, v)
    }

    fn opt_float(&self, key: &str) -> Result<Option<f32>, ConfigError> {
        self.f.get(key).map(|v| self.float_of(key, v)).transpose()
    }

    fn string(&self, key: &str) -> Result<&'a str, ConfigError> {
        let v = self.required(key)?;
        v.as_str().ok_or_else(|| self.wrong(key, "a string", v))
    }

    /// A value that is either one unsigned integer for every layer or an
    /// array of exactly `n` unsigned integers (llama.cpp `get_key_or_arr`).
    fn uint_per_layer(&self, key: &str, n: usize) -> Result<Vec<usize>, ConfigError> {
        let v = self.required(key)?;
        match v {
            GgufValue::Array(a) => {
                if a.len() != n {
                    return Err(self.err(
                        key,
                        ConfigErrorKind::WrongLength {
                            expected: n,
                            found: a.len(),
                        },
                    ));
                }
                a.values
                    .iter()
                    .map(|e| {
                        e.as_u64()
                            .and_then(|x| usize::try_from(x).ok())
                            .ok_or_else(|| {
                                self.wrong(key, "an unsigned integer or an array of them", e)
                            })
                    })
                    .collect()
            }
            _ => Ok(vec![self.uint_of(key, v)?; n]),
        }
    }

    fn bool_per_layer(&self, key: &str, n: usize) -> Result<Vec<bool>, ConfigError> {
        let v = self.required(key)?;
        let expected = "an array of bool (one per layer)";
        let a = v.as_array().ok_or_else(|| self.wrong(key, expected, v))?;
        if a.len() != n {
            return Err(self.err(
                key,
                ConfigErrorKind::WrongLength {
                    expected: n,
                    found: a.len(),
                },
            ));
        }
        a.to_bool_vec().ok_or_else(|| self.wrong(key, expected, v))
    }

    fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        self.err(key, ConfigErrorKind::InvalidValue(reason.into()))
    }

    fn positive(&self, key: &str, value: usize) -> Result<usize, ConfigError> {
        if value == 0 {
            return Err(self.invalid(key, "must be greater than 0"));
        }
        Ok(value)
    }
}

fn k(name: &str) -> String {
    format!("{ARCH}.{name}")
}

impl Gemma4Config {
    /// Resolves the config of a `gemma4` GGUF file and validates every
    /// tensor's presence, type and shape against it (`plan::validate_tensors`).
    pub fn from_gguf(f: &GgufFile) -> Result<Gemma4Config, ConfigError> {
        let cfg = Self::from_gguf_metadata(f)?;
        crate::plan::validate_tensors(&cfg, f)?;
        Ok(cfg)
    }

    /// Resolves the config from metadata plus the few tensor facts it
    /// depends on (which layers have `attn_v` and `layer_output_scale`, the
    /// vocab from `token_embd`, the `rope_freqs` values, on a MoE model
    /// whether layer 0's gate and up experts are one tensor), without checking
    /// the other tensors.
    pub fn from_gguf_metadata(f: &GgufFile) -> Result<Gemma4Config, ConfigError> {
        let m = Meta { f };
        let arch = m.string("general.architecture")?;
        if arch != ARCH {
            return Err(m.err(
                "general.architecture",
                ConfigErrorKind::WrongArchitecture(arch.to_string()),
            ));
        }
        let moe = read_moe(&m, f)?;

        let name = f
            .get("general.name")
            .and_then(GgufValue::as_str)
            .map(str::to_string);
        let d_model = m.positive(&k("embedding_length"), m.uint(&k("embedding_length"))?)?;
        let n_layers = m.positive(&k("block_count"), m.uint(&k("block_count"))?)?;
        let context_length = m.uint(&k("context_length"))?;

        let swa_key = k("attention.sliding_window_pattern");
        let is_swa = m.bool_per_layer(&swa_key, n_layers)?;
        let kinds: Vec<AttnKind> = is_swa
            .iter()
            .map(|&s| if s { AttnKind::Sliding } else { AttnKind::Full })
            .collect();
        let any_swa = is_swa.iter().any(|&s| s);

        // Head dims: K and V lengths must agree per type (llama.cpp throws too).
        let hd_full = m.positive(
            &k("attention.key_length"),
            m.uint(&k("attention.key_length"))?,
        )?;
        let vd_full = m.uint(&k("attention.value_length"))?;
        if vd_full != hd_full {
            return Err(m.invalid(
                &k("attention.value_length"),
                format!("{vd_full} differs from key_length {hd_full}"),
            ));
        }
        let hd_swa_key = k("attention.key_length_swa");
        let hd_swa = if any_swa {
            m.positive(&hd_swa_key, m.uint(&hd_swa_key)?)?
        } else {
            m.opt_uint(&hd_swa_key)?.unwrap_or(hd_full)
        };
        let vd_swa_key = k("attention.value_length_swa");
        let vd_swa = if any_swa {
            m.uint(&vd_swa_key)?
        } else {
            m.opt_uint(&vd_swa_key)?.unwrap_or(hd_swa)
        };
        if vd_swa != hd_swa {
            return Err(m.invalid(
                &vd_swa_key,
                format!("{vd_swa} differs from key_length_swa {hd_swa}"),
            ));
        }
        for (key, hd) in [
            (k("attention.key_length"), hd_full),
            (hd_swa_key.clone(), hd_swa),
        ] {
            if hd % 2 != 0 {
                return Err(m.invalid(
                    &key,
                    format!("head dim {hd} must be even (NeoX RoPE pairs)"),
                ));
            }
        }

        let heads_key = k("attention.head_count");
        let n_heads = m.uint_per_layer(&heads_key, n_layers)?;
        let kv_key = k("attention.head_count_kv");
        let n_kv = m.uint_per_layer(&kv_key, n_layers)?;
        let ffn_key = k("feed_forward_length");
        let ffn = m.uint_per_layer(&ffn_key, n_layers)?;
        for i in 0..n_layers {
            let at = |key: &str, r: String| m.invalid(key, format!("layer {i}: {r}"));
            if n_heads[i] == 0 {
                return Err(at(&heads_key, "0 heads".into()));
            }
            if n_kv[i] == 0 || n_heads[i] % n_kv[i] != 0 {
                return Err(at(
                    &kv_key,
                    format!(
                        "{} KV heads do not divide {} query heads",
                        n_kv[i], n_heads[i]
                    ),
                ));
            }
            if ffn[i] == 0 {
                return Err(at(&ffn_key, "FFN width 0".into()));
            }
        }

        let window_key = k("attention.sliding_window");
        let sliding_window = if any_swa {
            m.positive(&window_key, m.uint(&window_key)?)?
        } else {
            m.opt_uint(&window_key)?.unwrap_or(0)
        };
        let eps_key = k("attention.layer_norm_rms_epsilon");
        let rms_eps = m.float(&eps_key)?;
        if !(rms_eps.is_finite() && rms_eps > 0.0) {
            return Err(m.invalid(
                &eps_key,
                format!("{rms_eps} is not a positive finite number"),
            ));
        }
        let ple_dim = m
            .opt_uint(&k("embedding_length_per_layer_input"))?
            .unwrap_or(0);
        let shared_key = k("attention.shared_kv_layers");
        let n_kv_shared_layers = m.opt_uint(&shared_key)?.unwrap_or(0);
        if n_kv_shared_layers >= n_layers && n_kv_shared_layers > 0 {
            return Err(m.invalid(
                &shared_key,
                format!(
                    "{n_kv_shared_layers} shared layers leave no layer of the {n_layers} to own KV"
                ),
            ));
        }
        let softcap_key = k("final_logit_softcapping");
        let softcap = m.opt_float(&softcap_key)?.unwrap_or(30.0);
        if !softcap.is_finite() || softcap < 0.0 {
            return Err(m.invalid(&softcap_key, format!("{softcap} is not a finite cap >= 0")));
        }
        let final_logit_softcap = (softcap > 0.0).then_some(softcap);

        // RoPE. Defaults follow llama.cpp: dims = head dim, base 10 000 and
        // the SWA base equal to the full one when its key is absent.
        let rope_dims_key = k("rope.dimension_count");
        let rope_dims_full = m.opt_uint(&rope_dims_key)?.unwrap_or(hd_full);
        let rope_dims_swa_key = k("rope.dimension_count_swa");
        let rope_dims_swa = m.opt_uint(&rope_dims_swa_key)?.unwrap_or(hd_swa);
        for (key, dims, hd) in [
            (&rope_dims_key, rope_dims_full, hd_full),
            (&rope_dims_swa_key, rope_dims_swa, hd_swa),
        ] {
            if dims == 0 || dims % 2 != 0 || dims > hd {
                return Err(m.invalid(
                    key,
                    format!("{dims} must be even, > 0 and <= head dim {hd}"),
                ));
            }
        }
        let base_full = m.opt_float(&k("rope.freq_base"))?.unwrap_or(10_000.0);
        let base_swa = m.opt_float(&k("rope.freq_base_swa"))?.unwrap_or(base_full);
        for (key, base) in [
            (k("rope.freq_base"), base_full),
            (k("rope.freq_base_swa"), base_swa),
        ] {
            if !(base.is_finite() && base > 0.0) {
                return Err(m.invalid(&key, format!("{base} is not a positive finite base")));
            }
        }
        let freq_factors = read_rope_freqs(f, rope_dims_full)?;

        // Vocab: the tokenizer's token count when present, else token_embd.
        let vocab_size = match f.get("tokenizer.ggml.tokens") {
            Some(v) => v
                .as_array()
                .map(|a| a.len())
                .ok_or_else(|| m.wrong("tokenizer.ggml.tokens", "an array of strings", v))?,
            None => {
                let t = f.tensor("token_embd.weight").ok_or_else(|| {
                    ConfigError::new(
                        f.path(),
                        "tensor 'token_embd.weight'",
                        ConfigErrorKind::MissingTensor,
                    )
                })?;
                match t.dims.as_slice() {
                    [_, v] => usize::try_from(*v).unwrap_or(usize::MAX),
                    _ => {
                        return Err(ConfigError::new(
                            f.path(),
                            "tensor 'token_embd.weight'",
                            ConfigErrorKind::InvalidValue(format!(
                                "expected 2 dims [d_model, vocab], found {:?}",
                                t.dims
                            )),
                        ))
                    }
                }
            }
        };
        if vocab_size == 0 {
            return Err(m.invalid("tokenizer.ggml.tokens", "empty vocab"));
        }

        let donors = resolve_kv_donors(&kinds, n_kv_shared_layers).map_err(|layer| {
            ConfigError::new(
                f.path(),
                format!("layer {layer}"),
                ConfigErrorKind::NoDonor {
                    layer,
                    kind: kinds[layer].short_name(),
                },
            )
        })?;

        let mut layers: Vec<LayerConfig> = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let kind = kinds[i];
            let head_dim = match kind {
                AttnKind::Sliding => hd_swa,
                AttnKind::Full => hd_full,
            };
            let has_v = f.tensor(&format!("blk.{i}.attn_v.weight")).is_some();
            let k_eq_v = match donors[i] {
                None => !has_v,
                // A shared layer computes no K/V; it inherits the donor's
                // V rule so its plan lists the same K/V tensors.
                Some(d) => layers[d].k_eq_v,
            };
            if let Some(d) = donors[i] {
                if n_kv[d] != n_kv[i] {
                    return Err(m.invalid(
                        &kv_key,
                        format!(
                            "layer {i} reads layer {d}'s KV cache but has {} KV heads, the donor {}",
                            n_kv[i], n_kv[d]
                        ),
                    ));
                }
            }
            layers.push(LayerConfig {
                index: i,
                kind,
                head_dim,
                n_heads: n_heads[i],
                n_kv_heads: n_kv[i],
                ffn_dim: ffn[i],
                kv_donor: donors[i],
                k_eq_v,
                has_layer_scale: f
                    .tensor(&format!("blk.{i}.layer_output_scale.weight"))
                    .is_some(),
            });
        }

        Ok(Gemma4Config {
            name,
            d_model,
            n_layers,
            vocab_size,
            context_length,
            sliding_window,
            rms_eps,
            ple_dim,
            n_kv_shared_layers,
            final_logit_softcap,
            rope_swa: RopeConfig {
                freq_base: base_swa,
                dims: rope_dims_swa,
                freq_factors: None,
            },
            rope_full: RopeConfig {
                freq_base: base_full,
                dims: rope_dims_full,
                freq_factors,
            },
            layers,
            moe,
        })
    }
}

/// The MoE keys (`expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`): `None` when `expert_count` is absent or
/// 0 (a dense model). The expert layout (fused `ffn_gate_up_exps` or the
/// older separate gate and up stacks) is read from layer 0's tensors;
/// `plan::validate_tensors` then holds every layer to it.
fn read_moe(m: &Meta<'_>, f: &GgufFile) -> Result<Option<MoeConfig>, ConfigError> {
    let count_key = k("expert_count");
    let n_experts = match m.opt_uint(&count_key)? {
        None | Some(0) => return Ok(None),
        Some(n) => n,
    };
    let used_key = k("expert_used_count");
    let n_experts_used = m.positive(&used_key, m.uint(&used_key)?)?;
    if n_experts_used > n_experts {
        return Err(m.invalid(
            &used_key,
            format!("{n_experts_used} experts used per token, but the model has {n_experts}"),
        ));
    }
    let ffn_key = k("expert_feed_forward_length");
    let expert_ffn_dim = m.positive(&ffn_key, m.uint(&ffn_key)?)?;
    let gate_up_fused = f.tensor("blk.0.ffn_gate_exps.weight").is_none();
    Ok(Some(MoeConfig {
        n_experts,
        n_experts_used,
        expert_ffn_dim,
        gate_up_fused,
    }))
}

/// `rope_freqs.weight` values (dequantized), or `None` when the file has
/// no such tensor. Its length must be `rope_dims / 2`.
fn read_rope_freqs(f: &GgufFile, rope_dims: usize) -> Result<Option<Vec<f32>>, ConfigError> {
    let name = "rope_freqs.weight";
    let Some(t) = f.tensor(name) else {
        return Ok(None);
    };
    let err = |kind| ConfigError::new(f.path(), format!("tensor '{name}'"), kind);
    let expected = vec![(rope_dims / 2) as u64];
    if t.dims != expected {
        return Err(err(ConfigErrorKind::TensorShape {
            expected,
            found: t.dims.clone(),
        }));
    }
    if !t.ty.can_dequantize() {
        return Err(err(ConfigErrorKind::UnsupportedType(
            t.ty.name().to_string(),
        )));
    }
    let mut out = vec![0f32; rope_dims / 2];
    gemtune_kernels::quant::dequantize_row(t.ty, f.tensor_data(t), &mut out)
        .map_err(|e| err(ConfigErrorKind::Data(e.to_string())))?;
    if let Some(bad) = out.iter().find(|x| !(x.is_finite() && **x > 0.0)) {
        return Err(err(ConfigErrorKind::InvalidValue(format!(
            "frequency factor {bad} is not a positive finite number"
        ))));
    }
    Ok(Some(out))
}
