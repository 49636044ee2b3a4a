//! The upload: every matrix, table, router and expert stack of a model on
//! the device in the layouts the forward plan reads, and the per-layer
//! handles the stages launch with.

use gemtune_kernels::family::WType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};
use gemtune_kernels::quant::GgmlType;
use std::sync::Arc;

use super::host::{device_blocks, expert_blocks, HostCopies};
use super::{
    device_type, fused_runs, head_copy_type, planned_bytes, qkv_run_name, router_type, GpuMatrix,
    Layouts, ProjLayouts, EMBED_TYPES,
};
use crate::config::AttnKind;
use crate::cuda::slots::Proj;
use crate::model::{ExpertMats, MatRef, Model};
use crate::rope::RopeFreqs;

/// Uploads `parts` (matrices with the same input width, concatenated along
/// their outputs) in `layouts`.
pub fn upload_matrix(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&MatRef],
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
    upload_matrix_as(gpu, model, name, parts, device_type(&types), layouts)
}

/// `upload_matrix` read as `wt` (converted at load when the file's type
/// differs: the tied head under a profile's `head_convert`).
pub fn upload_matrix_as(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&MatRef],
    wt: WType,
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let k = parts[0].n_in;
    if parts.iter().any(|p| p.n_in != k) || k % 32 != 0 {
        return Err(GpuError::Other(format!(
            "{name}: the fused matrices need one input width that is a multiple of 32"
        )));
    }
    let n: usize = parts.iter().map(|p| p.n_out).sum();
    let gguf = device_blocks(model, parts, wt)?;
    upload_blocks(gpu, name, wt, &gguf, (n, k), layouts)
}

/// Uploads an `[n][k]` matrix of device type `wt`, given as GGUF blocks,
/// in `layouts` (the copies `HostCopies::build` makes).
fn upload_blocks(
    gpu: &Gpu,
    name: &str,
    wt: WType,
    gguf: &[u8],
    (n, k): (usize, usize),
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let c = HostCopies::build(wt, gguf, n, k, layouts)
        .map_err(|e| GpuError::Other(format!("{name}: {e}")))?;
    // The fit check counted `planned_bytes`; the copies are those bytes.
    debug_assert_eq!(c.bytes(), planned_bytes(wt, n, k, layouts), "{name}");
    let up = |v: Option<Vec<u8>>| v.map(|v| gpu.upload(&v)).transpose();
    Ok(GpuMatrix {
        name: name.to_string(),
        n,
        k,
        wtype: wt,
        q: up(c.q)?,
        d16: up(c.d16)?,
        d32: up(c.d32)?,
        blocks: up(c.blocks)?.map(Arc::new),
        blocks_shared: false,
        bf16: c.bf16.map(|v| gpu.upload(&v)).transpose()?,
    })
}

/// A tensor uploaded as its GGUF bytes (embedding tables). `buf` is shared
/// with the tied head when it reads the table's Q6_K blocks.
pub struct GpuTable {
    pub ty: GgmlType,
    pub buf: Arc<DeviceBuffer>,
}

pub fn upload_table(
    gpu: &Gpu,
    model: &Model,
    m: &MatRef,
    readable: &[GgmlType],
) -> Result<GpuTable, GpuError> {
    if !readable.contains(&m.ty) {
        let q = device_blocks(model, &[m], WType::Q8_0)?;
        return Ok(GpuTable {
            ty: GgmlType::Q8_0,
            buf: Arc::new(gpu.upload(&q)?),
        });
    }
    Ok(GpuTable {
        ty: m.ty,
        buf: Arc::new(gpu.upload(model.mat_bytes(m))?),
    })
}

/// One layer's device weights.
pub struct LayerWeights {
    /// Q | K | V (K-shared layers: Q only; k_eq_v layers: Q | K), in the
    /// runs of `fused_runs` (one unless the parts' types differ).
    pub qkv: Vec<GpuMatrix>,
    pub o: GpuMatrix,
    /// gate | up.
    pub gate_up: GpuMatrix,
    pub down: GpuMatrix,
    pub ple_gate: Option<GpuMatrix>,
    pub ple_proj: Option<GpuMatrix>,
    pub attn_norm: DeviceBuffer,
    pub q_norm: DeviceBuffer,
    pub k_norm: Option<DeviceBuffer>,
    pub post_attn_norm: DeviceBuffer,
    pub ffn_norm: DeviceBuffer,
    pub post_ffw_norm: DeviceBuffer,
    pub ple_post_norm: Option<DeviceBuffer>,
    /// The mixture-of-experts block (26B-A4B).
    pub moe: Option<MoeLayerWeights>,
}

/// The device weights of a MoE layer's expert block.
pub struct MoeLayerWeights {
    /// `ffn_gate_inp` as GGUF stores it (`model_dims::router_type`).
    pub router: DeviceBuffer,
    /// f32 `[d]`: `ffn_gate_inp.scale * d^-1/2`, the weight of the router
    /// input's norm.
    pub router_norm: DeviceBuffer,
    /// f32 `[E]`: `ffn_down_exps.scale`.
    pub expert_scale: DeviceBuffer,
    /// Every expert's gate then up rows, `E * 2 * ffn` rows of `d`.
    pub gate_up: GpuMatrix,
    /// `E * d` rows of `ffn`.
    pub down: GpuMatrix,
    pub pre_norm_2: DeviceBuffer,
    pub post_norm_1: DeviceBuffer,
    pub post_norm_2: DeviceBuffer,
}

impl MoeLayerWeights {
    fn bytes(&self) -> u64 {
        self.router.bytes() as u64 + self.gate_up.bytes() + self.down.bytes()
    }
}

/// Uploads an expert stack (`expert_blocks`) in `layouts`.
fn upload_experts(
    gpu: &Gpu,
    model: &Model,
    name: &str,
    parts: &[&ExpertMats],
    layouts: Layouts,
) -> Result<GpuMatrix, GpuError> {
    let k = parts[0].n_in;
    if parts
        .iter()
        .any(|p| p.n_in != k || p.n_experts != parts[0].n_experts)
        || k % 32 != 0
    {
        return Err(GpuError::Other(format!(
            "{name}: the fused expert stacks need one input width (a multiple of 32) and one expert count"
        )));
    }
    let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
    let wt = device_type(&types);
    let n = parts[0].n_experts * parts.iter().map(|p| p.n_out).sum::<usize>();
    let gguf = expert_blocks(model, parts, wt)?;
    upload_blocks(gpu, name, wt, &gguf, (n, k), layouts)
}

/// Uploads layer `i`'s MoE block.
fn upload_moe(
    gpu: &Gpu,
    model: &Model,
    i: usize,
    mw: &crate::model::MoeWeights,
    lay: &ProjLayouts,
) -> Result<MoeLayerWeights, GpuError> {
    let d = model.config().d_model;
    let rt = router_type(mw.router.ty);
    let router = if rt == mw.router.ty {
        gpu.upload(model.mat_bytes(&mw.router))?
    } else {
        gpu.upload(&device_blocks(model, &[&mw.router], WType::Q8_0)?)?
    };
    let inv_sqrt_d = 1.0f32 / (d as f32).sqrt();
    let router_norm: Vec<f32> = mw.router_scale.iter().map(|&g| g * inv_sqrt_d).collect();
    Ok(MoeLayerWeights {
        router,
        router_norm: gpu.upload(&router_norm)?,
        expert_scale: gpu.upload(&mw.expert_scale)?,
        gate_up: upload_experts(
            gpu,
            model,
            &format!("blk.{i}.ffn_gate_up_exps"),
            &[&mw.gate, &mw.up],
            lay.experts_gate_up,
        )?,
        down: upload_experts(gpu, model, &mw.down.name, &[&mw.down], lay.experts_down)?,
        pre_norm_2: gpu.upload(&mw.experts_pre_norm)?,
        post_norm_1: gpu.upload(&mw.shared_post_norm)?,
        post_norm_2: gpu.upload(&mw.experts_post_norm)?,
    })
}

/// A model's device weights.
pub struct DeviceWeights {
    pub layers: Vec<LayerWeights>,
    /// `token_embd` as GGUF bytes (the embedding gather); `None` when the
    /// gather reads the head's Q6_K planes (`ProjLayouts::embd_on_head`).
    pub embd: Option<GpuTable>,
    /// `token_embd` as the head reads it.
    pub head: GpuMatrix,
    pub output_norm: DeviceBuffer,
    pub ple_table: Option<GpuTable>,
    pub ple_model_proj: Option<GpuMatrix>,
    pub ple_proj_norm: Option<DeviceBuffer>,
    /// f32 `[n_layers]` layer scalars.
    pub layer_scales: DeviceBuffer,
    /// f64 inverse frequencies per layer kind (`[hd/2]`, `crate::rope`).
    pub rope_swa: DeviceBuffer,
    pub rope_full: DeviceBuffer,
    pub bytes: u64,
    pub bf16_bytes: u64,
}

impl DeviceWeights {
    /// The inverse RoPE frequencies of a layer kind.
    pub fn rope(&self, kind: AttnKind) -> &DeviceBuffer {
        match kind {
            AttnKind::Sliding => &self.rope_swa,
            AttnKind::Full => &self.rope_full,
        }
    }
}

/// The matrices of a layer's fused Q|K|V projection.
pub fn qkv_parts(lw: &crate::model::LayerWeights) -> Vec<&MatRef> {
    let mut parts: Vec<&MatRef> = vec![&lw.attn_q];
    if let Some(k) = &lw.attn_k {
        parts.push(k);
        if let Some(v) = &lw.attn_v {
            parts.push(v);
        }
    }
    parts
}

/// Uploads a model's weights in the layouts `lay` names.
pub fn upload(gpu: &Gpu, model: &Model, lay: &ProjLayouts) -> Result<DeviceWeights, GpuError> {
    let cfg = model.config();
    let w = model.weights();
    let mut layers = Vec::with_capacity(cfg.n_layers);
    let f32_buf = |v: &[f32]| gpu.upload(v);
    for (i, lw) in w.layers.iter().enumerate() {
        let up = |name: &str, parts: &[&MatRef], p: Proj| -> Result<GpuMatrix, GpuError> {
            upload_matrix(gpu, model, name, parts, lay.get(p))
        };
        let parts = qkv_parts(lw);
        let types: Vec<GgmlType> = parts.iter().map(|p| p.ty).collect();
        let runs = fused_runs(&types);
        let qkv = runs
            .iter()
            .enumerate()
            .map(|(j, r)| {
                up(
                    &qkv_run_name(i, j, runs.len()),
                    &parts[r.clone()],
                    Proj::Qkv,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let o = up(&lw.attn_output.name, &[&lw.attn_output], Proj::O)?;
        let gate_up = up(
            &format!("blk.{i}.ffn_gate_up"),
            &[&lw.ffn_gate, &lw.ffn_up],
            Proj::GateUp,
        )?;
        let down = up(&lw.ffn_down.name, &[&lw.ffn_down], Proj::Down)?;
        let (ple_gate, ple_proj, ple_post_norm) = match &lw.ple {
            Some(p) => (
                Some(up(&p.inp_gate.name, &[&p.inp_gate], Proj::Ple)?),
                Some(up(&p.proj.name, &[&p.proj], Proj::Ple)?),
                Some(f32_buf(&p.post_norm)?),
            ),
            None => (None, None, None),
        };
        layers.push(LayerWeights {
            qkv,
            o,
            gate_up,
            down,
            ple_gate,
            ple_proj,
            attn_norm: f32_buf(&lw.attn_norm)?,
            q_norm: f32_buf(&lw.attn_q_norm)?,
            k_norm: lw.attn_k_norm.as_deref().map(f32_buf).transpose()?,
            post_attn_norm: f32_buf(&lw.post_attention_norm)?,
            ffn_norm: f32_buf(&lw.ffn_norm)?,
            post_ffw_norm: f32_buf(&lw.post_ffw_norm)?,
            ple_post_norm,
            moe: lw
                .moe
                .as_ref()
                .map(|mw| upload_moe(gpu, model, i, mw, lay))
                .transpose()?,
        });
    }
    let embd = if lay.embd_on_head {
        None
    } else {
        Some(upload_table(gpu, model, &w.token_embd, EMBED_TYPES)?)
    };
    let head = if lay.head_native {
        let Some(embd) = &embd else {
            return Err(GpuError::Other(
                "token_embd: the head was planned on the table's bytes and the table on the head's planes".into(),
            ));
        };
        let wt = WType::of(embd.ty).filter(|_| embd.ty == w.token_embd.ty);
        let Some(wt) = wt else {
            return Err(GpuError::Other(format!(
                "token_embd: the head was planned on the table's own bytes, which hold {} (the file's {})",
                embd.ty.name(),
                w.token_embd.ty.name()
            )));
        };
        GpuMatrix::shared_blocks(
            "token_embd (head)",
            w.token_embd.n_out,
            w.token_embd.n_in,
            wt,
            embd.buf.clone(),
        )?
    } else {
        let wt = head_copy_type(lay, w.token_embd.ty);
        upload_matrix_as(
            gpu,
            model,
            "token_embd (head)",
            &[&w.token_embd],
            wt,
            lay.get(Proj::Head),
        )?
    };
    let (ple_table, ple_model_proj, ple_proj_norm) = match &w.ple {
        Some(p) => {
            let mp = upload_matrix(
                gpu,
                model,
                &p.model_proj.name,
                &[&p.model_proj],
                lay.get(Proj::Ple),
            )?;
            (
                Some(upload_table(gpu, model, &p.token_embd, EMBED_TYPES)?),
                Some(mp),
                Some(f32_buf(&p.proj_norm)?),
            )
        }
        None => (None, None, None),
    };
    let scales: Vec<f32> = w.layers.iter().map(|l| l.layer_scale).collect();
    let opt = |m: &Option<GpuMatrix>| m.as_ref().map(|m| m.bytes()).unwrap_or(0);
    let mut bytes: u64 = layers
        .iter()
        .map(|l| {
            l.qkv.iter().map(|m| m.bytes()).sum::<u64>()
                + l.o.bytes()
                + l.gate_up.bytes()
                + l.down.bytes()
                + opt(&l.ple_gate)
                + opt(&l.ple_proj)
                + l.moe.as_ref().map_or(0, |m| m.bytes())
        })
        .sum();
    bytes += embd.as_ref().map_or(0, |t| t.buf.bytes() as u64) + head.bytes();
    bytes += ple_table
        .as_ref()
        .map(|t| t.buf.bytes() as u64)
        .unwrap_or(0);
    bytes += opt(&ple_model_proj);
    let bf16_bytes = layers
        .iter()
        .map(|l| {
            l.qkv.iter().map(|m| m.bf16_bytes()).sum::<u64>()
                + l.o.bf16_bytes()
                + l.gate_up.bf16_bytes()
                + l.down.bf16_bytes()
        })
        .sum::<u64>()
        + ple_model_proj.as_ref().map(|m| m.bf16_bytes()).unwrap_or(0);
    let rope = |kind: AttnKind| gpu.upload(&RopeFreqs::new(cfg.rope(kind)).inv_freq);
    Ok(DeviceWeights {
        layers,
        embd,
        head,
        output_norm: f32_buf(&w.output_norm)?,
        ple_table,
        ple_model_proj,
        ple_proj_norm,
        layer_scales: f32_buf(&scales)?,
        rope_swa: rope(AttnKind::Sliding)?,
        rope_full: rope(AttnKind::Full)?,
        bytes,
        bf16_bytes,
    })
}
