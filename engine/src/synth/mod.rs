//! Synthetic Gemma 4 models with the exact layout of the published files.
//!
//! A synthetic file has the metadata keys of a published `gemma4` GGUF
//! (spec §4.1), the tensor names, shapes and count of `plan::tensor_plan`,
//! the synthetic BPE vocab of the tokenizer module, and random weights
//! scaled so activations stay O(1) through every layer:
//! - projections and expert stacks: symmetric, std 1/sqrt(fan_in) (fan_in
//!   = ne0);
//! - the MoE router: symmetric, std 1: its input is a weightless RMSNorm
//!   scaled by 1/sqrt(d), a vector of norm ≈ 1, so the router logits are
//!   O(1) and the routing is neither uniform nor one-hot;
//! - `token_embd`: std 1/sqrt(d) (×sqrt(d) at lookup gives O(1));
//!   `per_layer_token_embd`: std 1/sqrt(P) (×sqrt(P) at lookup);
//! - norm weights uniform in [0.5, 1.5], except `attn_k_norm` in
//!   [0.08, 0.2]: with attention scale 1.0, published K norms are ≈0.12,
//!   which keeps the q·k logits O(1–3) instead of O(16–22) and the softmax
//!   far from one-hot;
//! - the norms that scale each block's contribution to the residual stream
//!   (`post_attention_norm`, `post_ffw_norm`, `post_norm`) uniform in
//!   [0.05, 0.25], and `layer_output_scale` in [0.9, 1.0]: each layer adds a
//!   small update to a stream it mostly keeps, as in a trained model. Random
//!   blocks that replace most of the stream make the forward chaotic (a
//!   1e-6 perturbation grew to 1e-3 over 35 layers), so no reduced-precision
//!   kernel could be compared with the f32 reference; published layer
//!   scalars are smaller, but a trained model's blocks are not random;
//! - `rope_freqs` exactly the converter's factors.
//!
//! Storage: 2-D matrices and expert stacks in the requested type; 1-D
//! tensors and the MoE router F32 (llama.cpp never quantizes the router); the two
//! embedding tables as published files store them: Q8_0 for a q8_0 file,
//! Q6_K for a q4_0 file (Q8_0 when the row is not a multiple of 256, as
//! llama.cpp's quantizer falls back), the requested type for f32/f16/bf16.
//! The k-quant file types (q4_k_m, q5_k_m, q6_k) hold the mix llama.cpp's
//! quantizer writes (`mix`, docs/gemma4.md §4.3).

pub mod demo;
pub mod mix;
pub mod presets;
pub mod weights;

use crate::config::Gemma4Config;
use crate::gguf::{GgufError, GgufFile, GgufValue, GgufValueType, GgufWriter, TensorInfo};
use crate::plan::{tensor_plan, TensorRole, TensorSpec};
use crate::tokenizer::{train::build_synth_vocab, TokenizerError};
use gemtune_kernels::quant::GgmlType;
use std::collections::HashMap;
use std::path::Path;
use weights::{fill_tensor, Dist, FillError};

pub use demo::{builtin_model, builtin_model_description, BUILTIN_MODEL_LABEL};

/// The synthetic model variants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SynthVariant {
    Tiny,
    E2b,
    E4b,
    B12,
    B31,
    /// The mixture-of-experts 26B-A4B.
    B26A4b,
    /// Every feature of 26B-A4B at tiny size (`presets::tiny_moe`).
    TinyMoe,
}

impl SynthVariant {
    pub const ALL: [SynthVariant; 7] = [
        SynthVariant::Tiny,
        SynthVariant::E2b,
        SynthVariant::E4b,
        SynthVariant::B12,
        SynthVariant::B31,
        SynthVariant::B26A4b,
        SynthVariant::TinyMoe,
    ];

    /// CLI name: tiny, e2b, e4b, 12b, 31b, 26b-a4b, tiny-moe.
    pub fn name(self) -> &'static str {
        match self {
            SynthVariant::Tiny => "tiny",
            SynthVariant::E2b => "e2b",
            SynthVariant::E4b => "e4b",
            SynthVariant::B12 => "12b",
            SynthVariant::B31 => "31b",
            SynthVariant::B26A4b => "26b-a4b",
            SynthVariant::TinyMoe => "tiny-moe",
        }
    }

    pub fn from_name(s: &str) -> Option<SynthVariant> {
        SynthVariant::ALL.into_iter().find(|v| v.name() == s)
    }
}

/// The file type: the storage type of the 2-D weight matrices, uniform
/// (f32, f16, bf16, q8_0, q4_0) or llama.cpp's k-quant mix (q4_k_m, q5_k_m,
/// q6_k: `mix::tensor_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightType {
    F32,
    F16,
    Q8_0,
    Q4_0,
    Bf16,
    Q4KM,
    Q5KM,
    Q6K,
}

impl WeightType {
    pub const ALL: [WeightType; 8] = [
        WeightType::F32,
        WeightType::F16,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Bf16,
        WeightType::Q4KM,
        WeightType::Q5KM,
        WeightType::Q6K,
    ];

    /// CLI name: f32, f16, q8_0, q4_0, bf16, q4_k_m, q5_k_m, q6_k.
    pub fn name(self) -> &'static str {
        match self {
            WeightType::F32 => "f32",
            WeightType::F16 => "f16",
            WeightType::Q8_0 => "q8_0",
            WeightType::Q4_0 => "q4_0",
            WeightType::Bf16 => "bf16",
            WeightType::Q4KM => "q4_k_m",
            WeightType::Q5KM => "q5_k_m",
            WeightType::Q6K => "q6_k",
        }
    }

    pub fn from_name(s: &str) -> Option<WeightType> {
        WeightType::ALL.into_iter().find(|w| w.name() == s)
    }

    /// The type of most matrices: the uniform type, or the k-quant mix's
    /// base type (Q4_K, Q5_K, Q6_K).
    pub fn matrix_type(self) -> GgmlType {
        match self {
            WeightType::F32 => GgmlType::F32,
            WeightType::F16 => GgmlType::F16,
            WeightType::Q8_0 => GgmlType::Q8_0,
            WeightType::Q4_0 => GgmlType::Q4_0,
            WeightType::Bf16 => GgmlType::Bf16,
            WeightType::Q4KM => GgmlType::Q4K,
            WeightType::Q5KM => GgmlType::Q5K,
            WeightType::Q6K => GgmlType::Q6K,
        }
    }

    /// Type of an embedding table whose rows have `row` elements: Q6_K for
    /// q4_0 and the k-quant mixes (Q8_0 when the row is not whole 256-element
    /// super-blocks, as llama.cpp's quantizer falls back), the file's type
    /// otherwise.
    pub fn embedding_type(self, row: u64) -> GgmlType {
        match self {
            WeightType::Q4_0 | WeightType::Q4KM | WeightType::Q5KM | WeightType::Q6K
                if row % 256 == 0 =>
            {
                GgmlType::Q6K
            }
            WeightType::Q4_0 | WeightType::Q4KM | WeightType::Q5KM | WeightType::Q6K => {
                GgmlType::Q8_0
            }
            other => other.matrix_type(),
        }
    }

    /// llama.cpp `general.file_type` (LLAMA_FTYPE_ALL_F32 = 0,
    /// MOSTLY_F16 = 1, MOSTLY_Q4_0 = 2, MOSTLY_Q8_0 = 7, MOSTLY_Q4_K_M = 15,
    /// MOSTLY_Q5_K_M = 17, MOSTLY_Q6_K = 18, MOSTLY_BF16 = 32).
    pub fn file_type(self) -> u32 {
        match self {
            WeightType::F32 => 0,
            WeightType::F16 => 1,
            WeightType::Q4_0 => 2,
            WeightType::Q8_0 => 7,
            WeightType::Q4KM => 15,
            WeightType::Q5KM => 17,
            WeightType::Q6K => 18,
            WeightType::Bf16 => 32,
        }
    }

    /// Whether the file is a k-quant mix (types vary by tensor name and
    /// layer, `mix::tensor_types`).
    pub fn is_kquant_mix(self) -> bool {
        matches!(self, WeightType::Q4KM | WeightType::Q5KM | WeightType::Q6K)
    }
}

/// Options of a synthetic model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynthOptions {
    /// Overrides the variant's vocab (must hold the special and byte tokens).
    pub vocab: Option<usize>,
    pub seed: u64,
}

/// What was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthSummary {
    pub tensors: usize,
    /// File size in bytes.
    pub bytes: u64,
    pub parameters: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Vocab(#[from] TokenizerError),
    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// The published config of a variant (vocab 262,144; tiny 2,048).
pub fn preset(v: SynthVariant) -> Gemma4Config {
    match v {
        SynthVariant::Tiny => presets::tiny(),
        SynthVariant::E2b => presets::e2b(),
        SynthVariant::E4b => presets::e4b(),
        SynthVariant::B12 => presets::b12(),
        SynthVariant::B31 => presets::b31(),
        SynthVariant::B26A4b => presets::b26_a4b(),
        SynthVariant::TinyMoe => presets::tiny_moe(),
    }
}

/// The config a synthetic file of `v` with `opts` describes.
pub fn synth_config(v: SynthVariant, opts: &SynthOptions) -> Gemma4Config {
    let mut cfg = preset(v);
    if let Some(n) = opts.vocab {
        cfg.vocab_size = n;
    }
    cfg
}

/// Storage type of one planned tensor in a file of a uniform weight type
/// `w` (f32, f16, bf16, q8_0, q4_0). The k-quant mixes depend on where a
/// tensor sits among the others (`mix::tensor_types`, which is the
/// authority for every type); for them this gives the mix's type with the
/// position rules (attn_v, ffn_down) left out.
pub fn tensor_type(spec: &TensorSpec, w: WeightType) -> GgmlType {
    match spec.role {
        TensorRole::Embedding => w.embedding_type(spec.dims[0]),
        TensorRole::Matrix if w.is_kquant_mix() && spec.name == "per_layer_model_proj.weight" => {
            GgmlType::Bf16
        }
        TensorRole::Router => GgmlType::F32,
        TensorRole::Matrix | TensorRole::Experts if w.is_kquant_mix() => {
            mix::fallback(w.matrix_type(), spec.dims[0])
        }
        TensorRole::Matrix | TensorRole::Experts => {
            let ty = w.matrix_type();
            if spec.dims[0] % ty.block_size() as u64 == 0 {
                ty
            } else {
                GgmlType::F16
            }
        }
        TensorRole::Vector | TensorRole::Scalar | TensorRole::RopeFreqs => GgmlType::F32,
    }
}

/// The norms that scale what a block adds to the residual stream.
fn is_block_output_norm(name: &str) -> bool {
    [
        "post_attention_norm.weight",
        "post_ffw_norm.weight",
        "post_norm.weight",
    ]
    .iter()
    .any(|s| name.ends_with(s))
}

/// Value distribution of one planned tensor (see the module docs).
pub fn tensor_dist(cfg: &Gemma4Config, spec: &TensorSpec) -> Dist {
    match spec.role {
        TensorRole::Embedding => {
            let width = if spec.name == "token_embd.weight" {
                cfg.d_model
            } else {
                cfg.ple_dim.max(1)
            };
            Dist::Symmetric {
                std: 1.0 / (width as f32).sqrt(),
            }
        }
        TensorRole::Matrix | TensorRole::Experts => Dist::Symmetric {
            std: 1.0 / (spec.dims[0] as f32).sqrt(),
        },
        TensorRole::Router => Dist::Symmetric { std: 1.0 },
        TensorRole::Vector if spec.name.ends_with("attn_k_norm.weight") => {
            Dist::Range { lo: 0.08, hi: 0.2 }
        }
        TensorRole::Vector if is_block_output_norm(&spec.name) => {
            Dist::Range { lo: 0.05, hi: 0.25 }
        }
        TensorRole::Vector => Dist::Range { lo: 0.5, hi: 1.5 },
        TensorRole::Scalar => Dist::Range { lo: 0.9, hi: 1.0 },
        TensorRole::RopeFreqs => {
            Dist::Exact(cfg.rope_full.freq_factors.clone().unwrap_or_default())
        }
    }
}

fn uint_or_array(values: impl Iterator<Item = usize>) -> GgufValue {
    let v: Vec<u32> = values.map(|x| x as u32).collect();
    if v.windows(2).all(|w| w[0] == w[1]) && !v.is_empty() {
        GgufValue::U32(v[0])
    } else {
        GgufValue::array(GgufValueType::U32, v)
    }
}

/// The `general.*` and `gemma4.*` metadata of a config (spec §4.1).
pub fn model_metadata(cfg: &Gemma4Config, w: WeightType) -> Vec<(String, GgufValue)> {
    let hd = |kind| {
        cfg.layers
            .iter()
            .find(|l| l.kind == kind)
            .map(|l| l.head_dim)
            .unwrap_or(0) as u32
    };
    let hd_full = hd(crate::config::AttnKind::Full);
    let hd_swa = hd(crate::config::AttnKind::Sliding);
    let a = |k: &str| format!("gemma4.{k}");
    let mut m: Vec<(String, GgufValue)> = vec![
        ("general.architecture".into(), "gemma4".into()),
        (
            "general.name".into(),
            cfg.name.clone().unwrap_or_else(|| "gemma4".into()).into(),
        ),
        ("general.file_type".into(), GgufValue::U32(w.file_type())),
        ("general.quantization_version".into(), GgufValue::U32(2)),
        ("general.alignment".into(), GgufValue::U32(32)),
        (
            a("context_length"),
            GgufValue::U32(cfg.context_length as u32),
        ),
        (a("embedding_length"), GgufValue::U32(cfg.d_model as u32)),
        (a("block_count"), GgufValue::U32(cfg.n_layers as u32)),
        (
            a("feed_forward_length"),
            uint_or_array(cfg.layers.iter().map(|l| l.ffn_dim)),
        ),
        (
            a("attention.head_count"),
            uint_or_array(cfg.layers.iter().map(|l| l.n_heads)),
        ),
        (
            a("attention.head_count_kv"),
            uint_or_array(cfg.layers.iter().map(|l| l.n_kv_heads)),
        ),
        (a("attention.key_length"), GgufValue::U32(hd_full)),
        (a("attention.value_length"), GgufValue::U32(hd_full)),
        (a("attention.key_length_swa"), GgufValue::U32(hd_swa)),
        (a("attention.value_length_swa"), GgufValue::U32(hd_swa)),
        (
            a("rope.dimension_count"),
            GgufValue::U32(cfg.rope_full.dims as u32),
        ),
        (
            a("rope.dimension_count_swa"),
            GgufValue::U32(cfg.rope_swa.dims as u32),
        ),
        (a("rope.freq_base"), GgufValue::F32(cfg.rope_full.freq_base)),
        (
            a("rope.freq_base_swa"),
            GgufValue::F32(cfg.rope_swa.freq_base),
        ),
        (
            a("attention.sliding_window"),
            GgufValue::U32(cfg.sliding_window as u32),
        ),
        (
            a("attention.sliding_window_pattern"),
            GgufValue::array(
                GgufValueType::Bool,
                cfg.layers
                    .iter()
                    .map(|l| l.kind == crate::config::AttnKind::Sliding),
            ),
        ),
        (
            a("attention.layer_norm_rms_epsilon"),
            GgufValue::F32(cfg.rms_eps),
        ),
        (
            a("attention.shared_kv_layers"),
            GgufValue::U32(cfg.n_kv_shared_layers as u32),
        ),
        (
            a("embedding_length_per_layer_input"),
            GgufValue::U32(cfg.ple_dim as u32),
        ),
    ];
    if let Some(cap) = cfg.final_logit_softcap {
        m.push((a("final_logit_softcapping"), GgufValue::F32(cap)));
    }
    if let Some(moe) = &cfg.moe {
        m.push((a("expert_count"), GgufValue::U32(moe.n_experts as u32)));
        m.push((
            a("expert_used_count"),
            GgufValue::U32(moe.n_experts_used as u32),
        ));
        m.push((
            a("expert_feed_forward_length"),
            GgufValue::U32(moe.expert_ffn_dim as u32),
        ));
    }
    m
}

/// A synthetic model ready to be written: its config, a writer holding
/// all metadata and tensor infos, and the per-tensor distributions.
/// Tests may edit `writer` (or build another from its metadata and
/// tensors) before writing with `filler`.
pub struct SynthModel {
    pub config: Gemma4Config,
    pub writer: GgufWriter,
    pub seed: u64,
    dists: Dists,
}

impl SynthModel {
    pub fn new(v: SynthVariant, w: WeightType, opts: &SynthOptions) -> Result<Self, SynthError> {
        let config = synth_config(v, opts);
        Self::from_config(config, w, opts.seed)
    }

    /// A synthetic file for any config (vocab built for `config.vocab_size`).
    pub fn from_config(config: Gemma4Config, w: WeightType, seed: u64) -> Result<Self, SynthError> {
        let vocab = build_synth_vocab(config.vocab_size)?;
        let mut writer = GgufWriter::new();
        for (k, v) in model_metadata(&config, w) {
            writer.add_metadata(k, v);
        }
        for (k, v) in vocab.to_gguf_metadata() {
            writer.add_metadata(k, v);
        }
        let mut dists = HashMap::new();
        let plan = tensor_plan(&config);
        let types = mix::tensor_types(&plan, config.n_layers, w);
        for (i, (spec, ty)) in plan.into_iter().zip(types).enumerate() {
            writer.add_tensor(spec.name.clone(), spec.dims.clone(), ty)?;
            let dist = tensor_dist(&config, &spec);
            dists.insert(spec.name.clone(), (i as u64, spec.dims.clone(), dist));
        }
        Ok(SynthModel {
            config,
            writer,
            seed,
            dists,
        })
    }

    /// The fill callback for `GgufWriter::write_with`: generates each
    /// tensor by name (tensors unknown to the plan, or re-shaped, get a
    /// generic distribution), so it also fills edited writers.
    pub fn filler(
        &self,
    ) -> impl Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), FillError> + Sync + '_ {
        filler(&self.dists, self.seed)
    }

    pub fn summary(&self) -> SynthSummary {
        let infos = self.writer.tensor_infos();
        SynthSummary {
            tensors: infos.len(),
            bytes: self.writer.total_file_size(),
            parameters: infos.iter().map(TensorInfo::n_elements).sum(),
        }
    }

    pub fn write_to_file(self, path: &Path) -> Result<SynthSummary, SynthError> {
        let summary = self.summary();
        self.writer
            .write_with(path, filler(&self.dists, self.seed))?;
        Ok(summary)
    }

    pub fn write_to_vec(self) -> Result<Vec<u8>, SynthError> {
        Ok(self.writer.write_to_vec(filler(&self.dists, self.seed))?)
    }

    /// Writes the file with every tensor's values taken from `weights` (a
    /// GGUF holding each tensor of this layout under the same name and dims,
    /// in any type the CPU dequantizes) instead of random ones, requantized
    /// to this layout's types. This is how trained weights become a file of
    /// the published layout (`scripts/demo-model/build.sh`).
    pub fn write_with_weights(
        self,
        path: &Path,
        weights: &GgufFile,
    ) -> Result<SynthSummary, SynthError> {
        let summary = self.summary();
        self.writer.write_with(path, weights_filler(weights))?;
        Ok(summary)
    }
}

/// Fills each tensor from the tensor of the same name in `src`: dequantized
/// to f32 row by row, then stored in the destination type.
fn weights_filler(
    src: &GgufFile,
) -> impl Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), FillError> + Sync + '_ {
    move |_, info, dst| {
        let from = src
            .tensor(&info.name)
            .ok_or_else(|| FillError::Missing(info.name.clone()))?;
        if from.dims != info.dims {
            return Err(FillError::Shape {
                name: info.name.clone(),
                expected: info.dims.clone(),
                found: from.dims.clone(),
            });
        }
        let quant_err = |source| FillError::Quant {
            name: info.name.clone(),
            source,
        };
        let n = usize::try_from(info.n_elements()).map_err(|_| FillError::Size {
            expected: usize::MAX,
            found: dst.len(),
        })?;
        let mut values = vec![0.0f32; n];
        // Whole rows in both types (every GGUF row is a whole number of blocks).
        let row = info.dims.first().copied().unwrap_or(1).max(1) as usize;
        let src_bytes = src.tensor_data(from);
        let src_row = src_bytes.len() / (n / row).max(1);
        for (r, out) in values.chunks_exact_mut(row).enumerate() {
            gemtune_kernels::quant::dequantize_row(
                from.ty,
                &src_bytes[r * src_row..(r + 1) * src_row],
                out,
            )
            .map_err(quant_err)?;
        }
        gemtune_kernels::quant::quantize_row(info.ty, &values, dst).map_err(quant_err)
    }
}

/// Tensor name -> (plan index, planned dims, distribution).
type Dists = HashMap<String, (u64, Vec<u64>, Dist)>;

fn filler(
    dists: &Dists,
    seed: u64,
) -> impl Fn(usize, &TensorInfo, &mut [u8]) -> Result<(), FillError> + Sync + '_ {
    move |i, info, dst| {
        let fallback;
        let (index, dist) = match dists.get(&info.name) {
            Some((index, dims, dist)) if *dims == info.dims => (*index, dist),
            // A tensor unknown to the plan, or re-shaped by an edit: a
            // generic distribution for its rank.
            _ => {
                fallback = match info.dims.as_slice() {
                    [_] => Dist::Range { lo: 0.5, hi: 1.5 },
                    dims => Dist::Symmetric {
                        std: 1.0 / (dims.first().copied().unwrap_or(1).max(1) as f32).sqrt(),
                    },
                };
                ((1u64 << 32) + i as u64, &fallback)
            }
        };
        let n = usize::try_from(info.n_elements()).map_err(|_| FillError::Size {
            expected: usize::MAX,
            found: dst.len(),
        })?;
        fill_tensor(info.ty, dist, n, seed, index, dst)
    }
}

/// Writes a synthetic model to `path`.
pub fn synth_to_file(
    v: SynthVariant,
    w: WeightType,
    path: impl AsRef<Path>,
    opts: SynthOptions,
) -> Result<SynthSummary, SynthError> {
    SynthModel::new(v, w, &opts)?.write_to_file(path.as_ref())
}

/// A synthetic model in memory (meant for tiny: tests, the built-in model).
pub fn synth_to_vec(
    v: SynthVariant,
    w: WeightType,
    opts: SynthOptions,
) -> Result<Vec<u8>, SynthError> {
    SynthModel::new(v, w, &opts)?.write_to_vec()
}

/// Label of the random-weight tiny model's in-memory file.
pub const BUILTIN_TINY_LABEL: &str = "builtin:tiny";

/// The random-weight tiny model: Q8_0 matrices (the quantized path), seed 0.
/// Tests use it for its controlled activations; `run` without `-m` uses the
/// trained demo model instead (`builtin_model`).
pub fn builtin_tiny() -> Result<GgufFile, SynthError> {
    let bytes = synth_to_vec(
        SynthVariant::Tiny,
        WeightType::Q8_0,
        SynthOptions::default(),
    )?;
    Ok(GgufFile::from_bytes(bytes, BUILTIN_TINY_LABEL)?)
}
