//! Expected tensors of a Gemma 4 GGUF, derived from the config.
//!
//! `tensor_plan` lists every tensor a published `gemma4` text-decoder file
//! holds, with its shape in ggml `ne` order (ne0 = fastest = input dim,
//! spec §4.2). The synthetic-model writer emits exactly this list, and
//! `validate_tensors` checks a real file against it.
//!
//! KV-shared layers keep their (never used) `attn_k` / `attn_v` /
//! `attn_k_norm` tensors in published files, so the plan lists them with
//! `used = false`: they count towards the tensor and parameter totals, a
//! writer emits them, and a reader accepts a file that omits them.

use crate::config::{ConfigError, ConfigErrorKind, Gemma4Config, LayerConfig, MoeConfig};
use crate::gguf::GgufFile;
use std::collections::HashMap;

/// What a tensor is for; decides how the synthetic writer fills it and which
/// storage type a quantized file gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorRole {
    /// A gather table (`token_embd`, `per_layer_token_embd`): one row per token.
    Embedding,
    /// A 2-D projection `[in, out]` used in matrix-vector products.
    Matrix,
    /// A 1-D RMSNorm weight.
    Vector,
    /// `blk.N.layer_output_scale.weight`: one scalar multiplying the residual stream.
    Scalar,
    /// `rope_freqs.weight`: per-pair RoPE frequency divisors of full layers.
    RopeFreqs,
    /// `blk.N.ffn_gate_inp.weight` `[d, E]`: the MoE router. A matrix, but
    /// llama.cpp's converter writes it F32 and its quantizer never
    /// quantizes it, in every file type.
    Router,
    /// A stack of one matrix per expert, `[n_in, n_out, E]`
    /// (`ffn_gate_up_exps`, `ffn_gate_exps`, `ffn_up_exps`,
    /// `ffn_down_exps`): stored and quantized like a matrix of rows `n_in`
    /// wide; a token reads only the slices of the experts it is routed to.
    Experts,
}

/// One tensor of the plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    /// ggml `ne` order: `dims[0]` is the contiguous (input) dimension.
    pub dims: Vec<u64>,
    pub role: TensorRole,
    /// `false` for the K/V weights of KV-shared layers: present in published
    /// files, never read by the forward pass, optional when validating.
    pub used: bool,
    /// Decoder layer the tensor belongs to (`None` for global tensors).
    pub layer: Option<usize>,
}

impl TensorSpec {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Name of a per-layer tensor: `blk.{layer}.{suffix}.weight`.
pub fn layer_tensor_name(layer: usize, suffix: &str) -> String {
    format!("blk.{layer}.{suffix}.weight")
}

/// Name of a per-layer scale tensor of the MoE block:
/// `blk.{layer}.{base}.scale` (`ffn_gate_inp.scale`, the router's input
/// scale; `ffn_down_exps.scale`, the per-expert output scales).
pub fn layer_scale_name(layer: usize, base: &str) -> String {
    format!("blk.{layer}.{base}.scale")
}

fn global(name: &str, dims: Vec<u64>, role: TensorRole) -> TensorSpec {
    TensorSpec {
        name: name.to_string(),
        dims,
        role,
        used: true,
        layer: None,
    }
}

fn per_layer(
    layer: usize,
    suffix: &str,
    dims: Vec<u64>,
    role: TensorRole,
    used: bool,
) -> TensorSpec {
    TensorSpec {
        name: layer_tensor_name(layer, suffix),
        dims,
        role,
        used,
        layer: Some(layer),
    }
}

/// Tensors of one decoder layer, in the order the writer emits them.
fn layer_plan(cfg: &Gemma4Config, l: &LayerConfig, out: &mut Vec<TensorSpec>) {
    use TensorRole::*;
    let d = cfg.d_model as u64;
    let i = l.index;
    let q = l.q_dim() as u64;
    let kv = l.kv_dim() as u64;
    let hd = l.head_dim as u64;
    let ff = l.ffn_dim as u64;
    let owns = l.owns_kv();
    out.push(per_layer(i, "attn_norm", vec![d], Vector, true));
    out.push(per_layer(i, "attn_q", vec![d, q], Matrix, true));
    out.push(per_layer(i, "attn_k", vec![d, kv], Matrix, owns));
    if !l.k_eq_v {
        out.push(per_layer(i, "attn_v", vec![d, kv], Matrix, owns));
    }
    out.push(per_layer(i, "attn_output", vec![q, d], Matrix, true));
    out.push(per_layer(i, "attn_q_norm", vec![hd], Vector, true));
    out.push(per_layer(i, "attn_k_norm", vec![hd], Vector, owns));
    out.push(per_layer(i, "post_attention_norm", vec![d], Vector, true));
    out.push(per_layer(i, "ffn_norm", vec![d], Vector, true));
    out.push(per_layer(i, "ffn_gate", vec![d, ff], Matrix, true));
    out.push(per_layer(i, "ffn_up", vec![d, ff], Matrix, true));
    out.push(per_layer(i, "ffn_down", vec![ff, d], Matrix, true));
    out.push(per_layer(i, "post_ffw_norm", vec![d], Vector, true));
    if cfg.has_ple() {
        let p = cfg.ple_dim as u64;
        out.push(per_layer(i, "inp_gate", vec![d, p], Matrix, true));
        out.push(per_layer(i, "proj", vec![p, d], Matrix, true));
        out.push(per_layer(i, "post_norm", vec![d], Vector, true));
    }
    if let Some(moe) = &cfg.moe {
        moe_plan(cfg, i, moe, out);
    }
    if l.has_layer_scale {
        out.push(per_layer(i, "layer_output_scale", vec![1], Scalar, true));
    }
}

/// The MoE tensors of layer `i` (beside the dense shared MLP, which is the
/// layer's `ffn_gate` / `ffn_up` / `ffn_down`).
fn moe_plan(cfg: &Gemma4Config, i: usize, moe: &MoeConfig, out: &mut Vec<TensorSpec>) {
    use TensorRole::*;
    let d = cfg.d_model as u64;
    let e = moe.n_experts as u64;
    let fe = moe.expert_ffn_dim as u64;
    let scale = |base: &str, dims: Vec<u64>| TensorSpec {
        name: layer_scale_name(i, base),
        dims,
        role: Vector,
        used: true,
        layer: Some(i),
    };
    out.push(per_layer(i, "ffn_gate_inp", vec![d, e], Router, true));
    out.push(scale("ffn_gate_inp", vec![d]));
    if moe.gate_up_fused {
        out.push(per_layer(
            i,
            "ffn_gate_up_exps",
            vec![d, 2 * fe, e],
            Experts,
            true,
        ));
    } else {
        out.push(per_layer(i, "ffn_gate_exps", vec![d, fe, e], Experts, true));
        out.push(per_layer(i, "ffn_up_exps", vec![d, fe, e], Experts, true));
    }
    out.push(per_layer(i, "ffn_down_exps", vec![fe, d, e], Experts, true));
    out.push(scale("ffn_down_exps", vec![e]));
    out.push(per_layer(i, "pre_ffw_norm_2", vec![d], Vector, true));
    out.push(per_layer(i, "post_ffw_norm_1", vec![d], Vector, true));
    out.push(per_layer(i, "post_ffw_norm_2", vec![d], Vector, true));
}

/// Every tensor a `gemma4` file with this config holds, in writer order.
pub fn tensor_plan(cfg: &Gemma4Config) -> Vec<TensorSpec> {
    use TensorRole::*;
    let d = cfg.d_model as u64;
    let v = cfg.vocab_size as u64;
    let mut out = Vec::with_capacity(8 + cfg.layers.len() * 18);
    out.push(global("token_embd.weight", vec![d, v], Embedding));
    if cfg.has_ple() {
        let row = (cfg.n_layers * cfg.ple_dim) as u64;
        out.push(global(
            "per_layer_token_embd.weight",
            vec![row, v],
            Embedding,
        ));
        out.push(global("per_layer_model_proj.weight", vec![d, row], Matrix));
        out.push(global(
            "per_layer_proj_norm.weight",
            vec![cfg.ple_dim as u64],
            Vector,
        ));
    }
    if let Some(ff) = &cfg.rope_full.freq_factors {
        out.push(global(
            "rope_freqs.weight",
            vec![ff.len() as u64],
            RopeFreqs,
        ));
    }
    for l in &cfg.layers {
        layer_plan(cfg, l, &mut out);
    }
    out.push(global("output_norm.weight", vec![d], Vector));
    out
}

/// Total elements of every planned tensor (unused shared-layer K/V
/// included, as llama.cpp counts a published file).
pub fn parameter_count(cfg: &Gemma4Config) -> u64 {
    tensor_plan(cfg).iter().map(TensorSpec::n_elements).sum()
}

/// The share of a tensor one token uses: `n_experts_used / n_experts` of
/// an expert stack, all of any other tensor; as (numerator, denominator).
pub fn active_share(cfg: &Gemma4Config, role: TensorRole) -> (u64, u64) {
    match (role, &cfg.moe) {
        (TensorRole::Experts, Some(moe)) => (moe.n_experts_used as u64, moe.n_experts as u64),
        _ => (1, 1),
    }
}

/// Parameters one token uses (`parameter_count` with each expert stack
/// counted at `n_experts_used / n_experts`: the "A4B" of 26B-A4B).
pub fn active_parameter_count(cfg: &Gemma4Config) -> u64 {
    tensor_plan(cfg)
        .iter()
        .map(|s| {
            let (num, den) = active_share(cfg, s.role);
            s.n_elements() * num / den
        })
        .sum()
}

/// Tensors a file may hold beyond the plan: a KV-shared layer's `attn_v`
/// when the layer's donor is k_eq_v (the shared layer's own unused V
/// projection). Returns the expected dims.
fn known_optional(cfg: &Gemma4Config, name: &str) -> Option<Vec<u64>> {
    let rest = name.strip_prefix("blk.")?;
    let (idx, suffix) = rest.split_once('.')?;
    let layer = cfg.layers.get(idx.parse::<usize>().ok()?)?;
    if suffix == "attn_v.weight" && !layer.owns_kv() {
        return Some(vec![cfg.d_model as u64, layer.kv_dim() as u64]);
    }
    None
}

fn tensor_err(f: &GgufFile, name: &str, kind: ConfigErrorKind) -> ConfigError {
    ConfigError::new(f.path(), format!("tensor '{name}'"), kind)
}

fn check_tensor(
    f: &GgufFile,
    name: &str,
    expected: &[u64],
    found: &crate::gguf::TensorInfo,
) -> Result<(), ConfigError> {
    if found.dims.as_slice() != expected {
        return Err(tensor_err(
            f,
            name,
            ConfigErrorKind::TensorShape {
                expected: expected.to_vec(),
                found: found.dims.clone(),
            },
        ));
    }
    if !found.ty.can_dequantize() {
        return Err(tensor_err(
            f,
            name,
            ConfigErrorKind::UnsupportedType(found.ty.name().to_string()),
        ));
    }
    Ok(())
}

/// Checks every tensor of `f` against the plan of `cfg`: each used tensor
/// present with the planned dims and a type the CPU can dequantize; unused
/// shared-layer K/V accepted when present (shape checked) or absent; any
/// other tensor is an error naming it.
pub fn validate_tensors(cfg: &Gemma4Config, f: &GgufFile) -> Result<(), ConfigError> {
    let plan = tensor_plan(cfg);
    let mut planned: HashMap<&str, &TensorSpec> = HashMap::with_capacity(plan.len());
    for spec in &plan {
        planned.insert(spec.name.as_str(), spec);
    }
    for spec in &plan {
        match f.tensor(&spec.name) {
            Some(info) => check_tensor(f, &spec.name, &spec.dims, info)?,
            None if spec.used => {
                return Err(tensor_err(f, &spec.name, ConfigErrorKind::MissingTensor));
            }
            None => {}
        }
    }
    let mut unexpected = Vec::new();
    for info in f.tensors() {
        if planned.contains_key(info.name.as_str()) {
            continue;
        }
        match known_optional(cfg, &info.name) {
            Some(dims) => check_tensor(f, &info.name, &dims, info)?,
            None => unexpected.push(info.name.clone()),
        }
    }
    if !unexpected.is_empty() {
        let item = format!("tensor '{}'", unexpected[0]);
        return Err(ConfigError::new(
            f.path(),
            item,
            ConfigErrorKind::UnexpectedTensors(unexpected),
        ));
    }
    Ok(())
}
