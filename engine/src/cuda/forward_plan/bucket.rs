//! What a row bucket runs, stage by stage: per layer the input norm, the
//! attention block, the FFN (and the expert block, the PLE injection) and
//! the layer end; each projection a `MatmulPlan` with the launches,
//! binding, input format and pre-pass it needs.

use gemtune_kernels::bind::matmul::{MatmulBinding, Prepass, TailMode};
use gemtune_kernels::bind::ActFormat;

use super::launch::LaunchId;
use super::MoePlan;
use crate::config::AttnKind;
use crate::cuda::model_dims::MatDim;
use crate::cuda::slots::{Proj, Slot};

/// The pre-pass producing a projection's input from an f32 buffer.
#[derive(Clone, Copy, Debug)]
pub struct PrepassPlan {
    pub kind: Prepass,
    pub launch: LaunchId,
}

/// How a projection runs.
#[derive(Clone, Debug)]
pub enum MatmulExec {
    /// One launch of a matmul family.
    Kernel {
        launch: LaunchId,
        binding: MatmulBinding,
    },
    /// A GEMV variant serving a prefill slot: launches on row blocks of at
    /// most `GEMV_BLOCK` rows; `blocks[i]` serves a block of `i + 1` rows.
    RowBlocks {
        blocks: Vec<(LaunchId, MatmulBinding)>,
    },
    /// cuBLAS's bf16 GEMM on weights dequantized at load, after
    /// `act_convert` turned the f32 input into bf16.
    Vendor { convert: LaunchId },
}

/// One projection at a bucket's rows.
#[derive(Clone, Debug)]
pub struct MatmulPlan {
    pub proj: Proj,
    pub slot: Slot,
    /// (n, k, type) of the matrix as planned.
    pub dim: MatDim,
    /// The format the projection reads its input in.
    pub input: ActFormat,
    /// When the input comes from an f32 buffer and the variant reads
    /// another format: the pre-pass that writes it into the `act` buffer.
    pub prepass: Option<PrepassPlan>,
    /// The `scale_expand` launch that writes the kernel's scale plane
    /// (`PLANES_F32`) from the GEMV's into the scale scratch buffer before
    /// it runs (`Profile::expand_gemm_scales`); `None`: the kernel reads
    /// the matrix's own planes.
    pub scales: Option<LaunchId>,
    pub exec: MatmulExec,
}

impl MatmulPlan {
    /// The bindings of this projection's launches (one, or per row block).
    pub fn bindings(&self) -> Vec<MatmulBinding> {
        match &self.exec {
            MatmulExec::Kernel { binding, .. } => vec![*binding],
            MatmulExec::RowBlocks { blocks } => blocks.iter().map(|b| b.1).collect(),
            MatmulExec::Vendor { .. } => Vec::new(),
        }
    }
    /// The fused gate+up GEMV: writes `gelu(gate) * up` itself, in
    /// `output()`'s format.
    pub fn fuses_gelu(&self) -> bool {
        self.bindings().iter().any(|b| b.matrices == 2)
    }
    /// The format the projection writes its output in: f32, or the split
    /// Q8 records of a GEMV bound to OUT=Q8_SPLIT.
    pub fn output(&self) -> ActFormat {
        match &self.exec {
            MatmulExec::Kernel { binding, .. } => binding.out,
            _ => ActFormat::F32,
        }
    }
    /// The sandwich-norm step the projection's GEMV runs in its last block
    /// (gemv TAIL=1, bound by the plan): then no norm launch follows it.
    pub fn tail(&self) -> TailMode {
        match &self.exec {
            MatmulExec::Kernel { binding, .. } => binding.tail,
            _ => TailMode::None,
        }
    }
}

/// One attention call: the kernel and how Q and O travel.
#[derive(Clone, Copy, Debug)]
pub struct AttnPlan {
    pub launch: LaunchId,
    pub kind: AttnKind,
    /// The attention reads Q in the cache type, so `qk_norm_rope` writes
    /// it so (`Q16 = 1`).
    pub q16: bool,
    /// The format O is written in: the output projection's input format
    /// when the variant can write it (no conversion pass between them),
    /// otherwise f32.
    pub out: ActFormat,
}

/// The per-layer-embedding injection of one layer (E2B/E4B).
#[derive(Clone, Debug)]
pub struct PleLayerPlan {
    /// `x += rmsnorm(y) * post_ffw_norm` (the FFN residual, nothing else);
    /// `None` where the down projection runs it in its tail.
    pub ffn_residual: Option<LaunchId>,
    /// `inp_gate` projection of the residual stream.
    pub gate: MatmulPlan,
    /// `gelu(gate) * ple[l]`, written in `proj`'s input format; `None`
    /// where the gate GEMV writes it itself (gemv FUSE=2, f32 rows).
    pub gelu: Option<LaunchId>,
    pub proj: MatmulPlan,
}

/// One decoder layer at a bucket's rows.
#[derive(Clone, Debug)]
pub struct LayerPlan {
    /// `act = rmsnorm(x) * attn_norm`, in `qkv`'s format: the first layer,
    /// and the first after the rows were compacted (otherwise the previous
    /// layer's end writes it).
    pub input_norm: LaunchId,
    /// One projection per Q|K|V run (`LayerDims::qkv`), all reading the
    /// input norm's one format.
    pub qkv: Vec<MatmulPlan>,
    pub qk_norm_rope: LaunchId,
    pub attention: AttnPlan,
    pub o: MatmulPlan,
    /// `x += rmsnorm(y) * post_attention_norm`, then `act = rmsnorm(x) *
    /// ffn_norm` in `gate_up`'s format; `None` where the output projection
    /// runs it in its tail.
    pub attn_residual: Option<LaunchId>,
    pub gate_up: MatmulPlan,
    /// `gelu(gate) * up` in `down`'s format; `None` when the gate/up GEMV
    /// fuses it.
    pub gelu: Option<LaunchId>,
    pub down: MatmulPlan,
    pub ple: Option<PleLayerPlan>,
    /// The expert block of a MoE layer (after the dense FFN above, which
    /// is its shared MLP).
    pub moe: Option<MoePlan>,
    /// The layer's last residual add (the FFN's, or the PLE's) times the
    /// layer scalar, then the next layer's input norm in its `qkv` format.
    pub end_with_next_norm: Option<LaunchId>,
    /// The same without the next norm (the last layer, or before the rows
    /// are compacted). `None` with `end_with_next_norm` where the layer's
    /// last projection (the PLE's, else down) runs the end in its tail,
    /// with the next layer's input norm where there is a next layer.
    pub end: Option<LaunchId>,
}

impl LayerPlan {
    /// The format every Q|K|V run reads (the input norm writes it).
    pub fn qkv_input(&self) -> ActFormat {
        self.qkv.first().map_or(ActFormat::F32, |m| m.input)
    }
}

/// The per-layer inputs of E2B/E4B.
#[derive(Clone, Debug)]
pub struct PleInputsPlan {
    /// The model projection of the scaled embedding.
    pub model_proj: MatmulPlan,
    /// Gather, chunk norm, sum and 1/sqrt 2 (`ple` kernel).
    pub gather: LaunchId,
}

/// Final norm, tied head and softcap.
#[derive(Clone, Debug)]
pub struct HeadPlan {
    pub norm: LaunchId,
    pub matmul: MatmulPlan,
    pub softcap: Option<LaunchId>,
}

/// Every launch of a chunk of at most `rows` rows.
#[derive(Clone, Debug)]
pub struct BucketPlan {
    pub rows: usize,
    pub embed: LaunchId,
    pub per_layer_inputs: Option<PleInputsPlan>,
    pub layers: Vec<LayerPlan>,
    /// Decode buckets only: the head runs at most `GEMV_MAX_ROWS` rows.
    pub head: Option<HeadPlan>,
    /// Every launch of the bucket, ascending.
    pub launches: Vec<LaunchId>,
}
