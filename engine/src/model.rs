//! A loaded model: GGUF file, config, tokenizer and weight views.
//!
//! Matrices are *views*: a `MatRef` records a tensor's type and shape, and
//! `Model::mat_bytes` hands out its bytes straight from the GGUF mapping, so a
//! multi-gigabyte file costs no copy. One-dimensional tensors (norm weights,
//! layer scalars) are small and read on every token, so they are dequantized
//! to `f32` once at load.
//!
//! Loading checks, in order: the architecture string, the config
//! (`Gemma4Config::from_gguf`), the tensor inventory (`plan::validate_tensors`),
//! the tokenizer, and that every tensor the forward pass reads has a type the
//! CPU can dequantize. The stacked expert tensors of a MoE model are views
//! too (`ExpertMats`), one matrix per expert. Tensors a layer does not use (the K/V projections that
//! published E2B/E4B files still carry on KV-shared layers) are not loaded.

use std::path::Path;

use gemtune_kernels::quant::{self, GgmlType, QuantError};

use crate::config::{ConfigError, Gemma4Config, MoeConfig};
use crate::gguf::{GgufError, GgufFile, TensorInfo};
use crate::plan;
use crate::tokenizer::{Tokenizer, TokenizerError};

/// Errors from loading a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{path}: tokenizer: {source}")]
    Tokenizer {
        path: String,
        #[source]
        source: TokenizerError,
    },
    #[error("{path}: general.architecture is {found}, expected 'gemma4' (this engine runs Gemma 4 text decoders only)")]
    WrongArchitecture { path: String, found: String },
    #[error("{path}: tensor '{name}': {reason}")]
    Tensor {
        path: String,
        name: String,
        reason: String,
    },
}

/// A weight matrix inside the GGUF mapping. GGUF `ne = [n_in, n_out]`: row
/// `o` (`n_in` elements, `row_bytes` bytes) produces output feature `o`.
#[derive(Clone, Debug)]
pub struct MatRef {
    pub name: String,
    pub ty: GgmlType,
    pub n_in: usize,
    pub n_out: usize,
    pub row_bytes: usize,
    info: TensorInfo,
}

/// Per-layer-embedding weights shared by all layers (E-models).
#[derive(Clone, Debug)]
pub struct PleWeights {
    /// `per_layer_token_embd.weight`: one row of `n_layers * ple_dim` per token.
    pub token_embd: MatRef,
    /// `per_layer_model_proj.weight`: d_model -> n_layers * ple_dim.
    pub model_proj: MatRef,
    /// `per_layer_proj_norm.weight` [ple_dim], shared by every chunk.
    pub proj_norm: Vec<f32>,
}

/// Per-layer PLE injection weights.
#[derive(Clone, Debug)]
pub struct LayerPleWeights {
    /// `blk.N.inp_gate.weight`: d_model -> ple_dim.
    pub inp_gate: MatRef,
    /// `blk.N.proj.weight`: ple_dim -> d_model.
    pub proj: MatRef,
    /// `blk.N.post_norm.weight` [d_model].
    pub post_norm: Vec<f32>,
}

/// One matrix of every expert of a layer, inside a stacked expert tensor
/// (GGUF `ne = [n_in, rows_per_expert, n_experts]`): expert `e`'s matrix is
/// the `n_out` rows from row `e * rows_per_expert + row_offset`. The fused
/// `ffn_gate_up_exps` holds two such matrices per expert (gate at offset 0,
/// up at offset `n_out`); every other stack holds one.
#[derive(Clone, Debug)]
pub struct ExpertMats {
    pub name: String,
    pub ty: GgmlType,
    pub n_in: usize,
    /// Rows (output features) of one expert's matrix.
    pub n_out: usize,
    pub n_experts: usize,
    pub row_bytes: usize,
    rows_per_expert: usize,
    row_offset: usize,
    info: TensorInfo,
}

/// The MoE block of one layer (beside the dense shared MLP, which is the
/// layer's `ffn_gate` / `ffn_up` / `ffn_down`).
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `blk.N.ffn_gate_inp.weight`: d_model -> n_experts router logits.
    pub router: MatRef,
    /// `blk.N.ffn_gate_inp.scale` [d_model]: multiplies the router input.
    pub router_scale: Vec<f32>,
    /// The experts' gate projections (d_model -> expert FFN).
    pub gate: ExpertMats,
    /// The experts' up projections (d_model -> expert FFN).
    pub up: ExpertMats,
    /// `blk.N.ffn_down_exps.weight`: expert FFN -> d_model.
    pub down: ExpertMats,
    /// `blk.N.ffn_down_exps.scale` [n_experts]: multiplies each chosen
    /// expert's routing weight.
    pub expert_scale: Vec<f32>,
    /// `blk.N.pre_ffw_norm_2.weight` [d_model]: the experts' input norm.
    pub experts_pre_norm: Vec<f32>,
    /// `blk.N.post_ffw_norm_1.weight` [d_model]: the shared MLP's output norm.
    pub shared_post_norm: Vec<f32>,
    /// `blk.N.post_ffw_norm_2.weight` [d_model]: the experts' output norm.
    pub experts_post_norm: Vec<f32>,
}

/// Everything one decoder layer reads.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub attn_q: MatRef,
    pub attn_q_norm: Vec<f32>,
    /// `None` on KV-shared layers (they read their donor's cache).
    pub attn_k: Option<MatRef>,
    /// `None` on KV-shared layers and on k_eq_v layers (V = raw K projection).
    pub attn_v: Option<MatRef>,
    /// `None` on KV-shared layers.
    pub attn_k_norm: Option<Vec<f32>>,
    pub attn_output: MatRef,
    pub post_attention_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub ffn_gate: MatRef,
    pub ffn_up: MatRef,
    pub ffn_down: MatRef,
    pub post_ffw_norm: Vec<f32>,
    /// `blk.N.layer_output_scale.weight`, 1.0 when the tensor is absent.
    pub layer_scale: f32,
    pub ple: Option<LayerPleWeights>,
    /// The routed experts of a MoE model (the `ffn_*` tensors above are
    /// then its dense shared MLP).
    pub moe: Option<MoeWeights>,
}

/// All weight views of a model.
#[derive(Clone, Debug)]
pub struct Weights {
    /// `token_embd.weight`: embedding table and (tied) output head.
    pub token_embd: MatRef,
    pub output_norm: Vec<f32>,
    pub ple: Option<PleWeights>,
    pub layers: Vec<LayerWeights>,
}

/// A Gemma 4 model ready for inference.
pub struct Model {
    file: GgufFile,
    config: Gemma4Config,
    tokenizer: Tokenizer,
    weights: Weights,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.file.path())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Open (mmap) and load a GGUF file.
    pub fn load(path: impl AsRef<Path>) -> Result<Model, ModelError> {
        let file = GgufFile::open(path.as_ref())?;
        Model::from_gguf(file)
    }

    /// Load from an already opened file (e.g. `synth::builtin_tiny()`).
    pub fn from_gguf(file: GgufFile) -> Result<Model, ModelError> {
        let path = file.path().display().to_string();
        match file.get("general.architecture") {
            Some(v) if v.as_str() == Some("gemma4") => {}
            Some(v) => {
                let found = match v.as_str() {
                    Some(s) => format!("'{s}'"),
                    None => format!("a {} value", v.type_name()),
                };
                return Err(ModelError::WrongArchitecture { path, found });
            }
            None => {
                return Err(ModelError::WrongArchitecture {
                    path,
                    found: "missing".to_string(),
                })
            }
        }
        let config = Gemma4Config::from_gguf(&file)?;
        plan::validate_tensors(&config, &file)?;
        let tokenizer = Tokenizer::from_gguf(&file).map_err(|source| ModelError::Tokenizer {
            path: path.clone(),
            source,
        })?;
        let weights = Loader {
            file: &file,
            path: &path,
            cfg: &config,
        }
        .load()?;
        Ok(Model {
            file,
            config,
            tokenizer,
            weights,
        })
    }

    pub fn config(&self) -> &Gemma4Config {
        &self.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    pub fn weights(&self) -> &Weights {
        &self.weights
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The bytes of a weight matrix (zero-copy from the mapping):
    /// `n_out` rows of `row_bytes` each.
    pub fn mat_bytes(&self, m: &MatRef) -> &[u8] {
        self.file.tensor_data(&m.info)
    }

    /// Bytes of row `row` of a matrix (an embedding gather reads one row).
    pub fn mat_row(&self, m: &MatRef, row: usize) -> &[u8] {
        &self.mat_bytes(m)[row * m.row_bytes..(row + 1) * m.row_bytes]
    }

    /// The bytes of expert `e`'s matrix in a stacked expert tensor:
    /// `n_out` rows of `row_bytes` each (zero-copy).
    pub fn expert_bytes(&self, m: &ExpertMats, e: usize) -> &[u8] {
        let first = e * m.rows_per_expert + m.row_offset;
        &self.file.tensor_data(&m.info)[first * m.row_bytes..(first + m.n_out) * m.row_bytes]
    }

    /// Any tensor by name: its type and bytes, zero-copy.
    pub fn tensor_bytes(&self, name: &str) -> Option<(GgmlType, &[u8])> {
        let t = self.file.tensor(name)?;
        Some((t.ty, self.file.tensor_data(t)))
    }

    /// Vocabulary size of the embedding table (the width of a logits row).
    pub fn vocab_size(&self) -> usize {
        self.weights.token_embd.n_out
    }
}

struct Loader<'a> {
    file: &'a GgufFile,
    path: &'a str,
    cfg: &'a Gemma4Config,
}

impl Loader<'_> {
    fn err(&self, name: &str, reason: impl Into<String>) -> ModelError {
        ModelError::Tensor {
            path: self.path.to_string(),
            name: name.to_string(),
            reason: reason.into(),
        }
    }

    fn info(&self, name: &str) -> Result<&TensorInfo, ModelError> {
        self.file
            .tensor(name)
            .ok_or_else(|| self.err(name, "missing"))
    }

    fn check_type(&self, t: &TensorInfo) -> Result<(), ModelError> {
        if t.ty.can_dequantize() {
            Ok(())
        } else {
            Err(self.err(
                &t.name,
                format!("type {} cannot be dequantized on the CPU", t.ty),
            ))
        }
    }

    /// A matrix with `ne = [n_in, n_out]`.
    fn mat(&self, name: &str, n_in: usize, n_out: usize) -> Result<MatRef, ModelError> {
        let t = self.info(name)?;
        let want = [n_in as u64, n_out as u64];
        if t.dims.as_slice() != want {
            return Err(self.err(name, format!("shape {:?}, expected {:?}", t.dims, want)));
        }
        self.check_type(t)?;
        let row_bytes = t.ty.row_bytes(n_in as u64).ok_or_else(|| {
            self.err(
                name,
                format!("rows of {n_in} are not whole {} blocks", t.ty),
            )
        })? as usize;
        Ok(MatRef {
            name: name.to_string(),
            ty: t.ty,
            n_in,
            n_out,
            row_bytes,
            info: t.clone(),
        })
    }

    /// A vector of `n` elements, dequantized to f32.
    fn vec(&self, name: &str, n: usize) -> Result<Vec<f32>, ModelError> {
        let t = self.info(name)?;
        if t.n_elements() != n as u64 || t.dims.iter().filter(|&&d| d != 1).count() > 1 {
            return Err(self.err(name, format!("shape {:?}, expected [{n}]", t.dims)));
        }
        self.check_type(t)?;
        let mut out = vec![0.0f32; n];
        quant::dequantize_row(t.ty, self.file.tensor_data(t), &mut out)
            .map_err(|e: QuantError| self.err(name, e.to_string()))?;
        Ok(out)
    }

    /// One matrix per expert inside the stacked tensor `name` of
    /// `ne = [n_in, rows_per_expert, n_experts]`: the `n_out` rows from
    /// `row_offset` of each expert's block.
    fn experts(
        &self,
        name: &str,
        n_in: usize,
        (rows_per_expert, row_offset, n_out): (usize, usize, usize),
        n_experts: usize,
    ) -> Result<ExpertMats, ModelError> {
        let t = self.info(name)?;
        let want = [n_in as u64, rows_per_expert as u64, n_experts as u64];
        if t.dims.as_slice() != want {
            return Err(self.err(name, format!("shape {:?}, expected {:?}", t.dims, want)));
        }
        self.check_type(t)?;
        let row_bytes = t.ty.row_bytes(n_in as u64).ok_or_else(|| {
            self.err(
                name,
                format!("rows of {n_in} are not whole {} blocks", t.ty),
            )
        })? as usize;
        Ok(ExpertMats {
            name: name.to_string(),
            ty: t.ty,
            n_in,
            n_out,
            n_experts,
            row_bytes,
            rows_per_expert,
            row_offset,
            info: t.clone(),
        })
    }

    /// The MoE tensors of layer `layer`.
    fn moe_weights(&self, layer: usize, moe: &MoeConfig) -> Result<MoeWeights, ModelError> {
        let d = self.cfg.d_model;
        let (e, fe) = (moe.n_experts, moe.expert_ffn_dim);
        let w = |s: &str| plan::layer_tensor_name(layer, s);
        let sc = |s: &str| plan::layer_scale_name(layer, s);
        let (gate, up) = if moe.gate_up_fused {
            let name = w("ffn_gate_up_exps");
            (
                self.experts(&name, d, (2 * fe, 0, fe), e)?,
                self.experts(&name, d, (2 * fe, fe, fe), e)?,
            )
        } else {
            (
                self.experts(&w("ffn_gate_exps"), d, (fe, 0, fe), e)?,
                self.experts(&w("ffn_up_exps"), d, (fe, 0, fe), e)?,
            )
        };
        Ok(MoeWeights {
            router: self.mat(&w("ffn_gate_inp"), d, e)?,
            router_scale: self.vec(&sc("ffn_gate_inp"), d)?,
            gate,
            up,
            down: self.experts(&w("ffn_down_exps"), fe, (d, 0, d), e)?,
            expert_scale: self.vec(&sc("ffn_down_exps"), e)?,
            experts_pre_norm: self.vec(&w("pre_ffw_norm_2"), d)?,
            shared_post_norm: self.vec(&w("post_ffw_norm_1"), d)?,
            experts_post_norm: self.vec(&w("post_ffw_norm_2"), d)?,
        })
    }

    fn load(&self) -> Result<Weights, ModelError> {
        let cfg = self.cfg;
        let d = cfg.d_model;
        let token_embd = self.mat("token_embd.weight", d, cfg.vocab_size)?;
        let output_norm = self.vec("output_norm.weight", d)?;
        let ple = if cfg.has_ple() {
            let lp = cfg.n_layers * cfg.ple_dim;
            Some(PleWeights {
                token_embd: self.mat("per_layer_token_embd.weight", lp, cfg.vocab_size)?,
                model_proj: self.mat("per_layer_model_proj.weight", d, lp)?,
                proj_norm: self.vec("per_layer_proj_norm.weight", cfg.ple_dim)?,
            })
        } else {
            None
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for lc in &cfg.layers {
            let p = |s: &str| format!("blk.{}.{s}.weight", lc.index);
            let hd = lc.head_dim;
            let (attn_k, attn_v, attn_k_norm) = if lc.owns_kv() {
                let k = self.mat(&p("attn_k"), d, lc.kv_dim())?;
                let v = if lc.k_eq_v {
                    None
                } else {
                    Some(self.mat(&p("attn_v"), d, lc.kv_dim())?)
                };
                (Some(k), v, Some(self.vec(&p("attn_k_norm"), hd)?))
            } else {
                (None, None, None)
            };
            let layer_scale = if lc.has_layer_scale {
                self.vec(&p("layer_output_scale"), 1)?[0]
            } else {
                1.0
            };
            let ple = if cfg.has_ple() {
                Some(LayerPleWeights {
                    inp_gate: self.mat(&p("inp_gate"), d, cfg.ple_dim)?,
                    proj: self.mat(&p("proj"), cfg.ple_dim, d)?,
                    post_norm: self.vec(&p("post_norm"), d)?,
                })
            } else {
                None
            };
            layers.push(LayerWeights {
                attn_norm: self.vec(&p("attn_norm"), d)?,
                attn_q: self.mat(&p("attn_q"), d, lc.q_dim())?,
                attn_q_norm: self.vec(&p("attn_q_norm"), hd)?,
                attn_k,
                attn_v,
                attn_k_norm,
                attn_output: self.mat(&p("attn_output"), lc.q_dim(), d)?,
                post_attention_norm: self.vec(&p("post_attention_norm"), d)?,
                ffn_norm: self.vec(&p("ffn_norm"), d)?,
                ffn_gate: self.mat(&p("ffn_gate"), d, lc.ffn_dim)?,
                ffn_up: self.mat(&p("ffn_up"), d, lc.ffn_dim)?,
                ffn_down: self.mat(&p("ffn_down"), lc.ffn_dim, d)?,
                post_ffw_norm: self.vec(&p("post_ffw_norm"), d)?,
                layer_scale,
                ple,
                moe: cfg
                    .moe
                    .as_ref()
                    .map(|moe| self.moe_weights(lc.index, moe))
                    .transpose()?,
            });
        }
        Ok(Weights {
            token_embd,
            output_norm,
            ple,
            layers,
        })
    }
}
