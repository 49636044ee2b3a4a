//! The CUDA forward pass: Gemma 4 on the GPU from the harness's own kernel
//! families, launched through their `bind` calling conventions and chosen
//! by a profile and the device's tuned table (`plan`).
//!
//! It mirrors the CPU forward stage by stage (`cpu::forward`): embed, per-
//! layer inputs, then per layer the attention block (norm, QKV projection,
//! Q/K norms with RoPE and the cache write, attention, output projection,
//! sandwich norm), the FFN block (norm, gate/up, GELU, down, sandwich norm),
//! the PLE injection and the layer scalar; then the head for the rows whose
//! logits are wanted. Chunks of `ubatch` tokens continue the cache; decode
//! steps replay one captured CUDA graph whose kernels read the token and its
//! position from device memory. The only per-token traffic over the bus is
//! the token id and position (in) and the logits rows (out).
//!
//! Everything is allocated at load (weights, caches, activation buffers) and
//! nothing is compiled after it: `new` plans and loads every kernel the
//! chunk and decode paths launch.

mod buffers;
pub mod calls;
mod forward;
mod kv_cache;
mod launch;
mod phases;
pub mod plan;
mod weights;

pub use kv_cache::cache_bytes;
pub use phases::PHASES;
pub use plan::{Decision, PlanError, Planner};

use gemtune_kernels::family::KvType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};
use gemtune_kernels::runtime::{Graph, PinnedBuf};

use crate::config::{AttnKind, Gemma4Config};
use crate::cpu::{LogitRows, Logits};
use crate::engine::{Engine, EngineError, PhaseTimes};
use crate::model::Model;
use crate::profile::Profile;
use crate::tuned::TunedFile;
use buffers::Buffers;
use kv_cache::KvCache;
use phases::Phases;
use weights::{GpuMatrix, GpuTable};

/// The committed tuned tables, by architecture.
pub const BUILTIN_TUNED: &[(&str, &str)] =
    &[("sm_90", include_str!("../../../variants/tuned/sm_90.toml"))];

/// How a CUDA engine is built.
#[derive(Clone, Debug)]
pub struct CudaOptions {
    /// Most positions the cache holds (capped at the context length).
    pub max_seq: usize,
    /// Most tokens per prefill chunk (sizes the buffers and the SWA rings).
    pub ubatch: usize,
    /// K/V cache type; `None`: the profile's, else F16.
    pub kv_type: Option<KvType>,
    pub profile: Profile,
    /// The tuned table; `None`: the committed one for the device, if any.
    pub tuned: Option<TunedFile>,
    /// Capture decode steps as a CUDA graph and replay it.
    pub graph: bool,
    /// Measure GPU time per phase with events.
    pub phases: bool,
    pub device: usize,
}

const GEMV_ROWS_PLUS_ONE: usize = forward::GEMV_MAX_ROWS + 1;

/// The default prefill chunk: the largest the engine's prefill buffers are
/// sized for without growing past a few hundred MB on the 12B/31B shapes.
pub const DEFAULT_UBATCH: usize = 2048;

impl CudaOptions {
    pub fn new(profile: Profile) -> CudaOptions {
        CudaOptions {
            max_seq: 4096,
            ubatch: DEFAULT_UBATCH,
            kv_type: None,
            profile,
            tuned: None,
            graph: true,
            phases: false,
            device: 0,
        }
    }
}

/// One layer's device weights.
struct LayerWeights {
    /// Q | K | V (K-shared layers: Q only; k_eq_v layers: Q | K).
    qkv: GpuMatrix,
    o: GpuMatrix,
    /// gate | up.
    gate_up: GpuMatrix,
    down: GpuMatrix,
    ple_gate: Option<GpuMatrix>,
    ple_proj: Option<GpuMatrix>,
    attn_norm: DeviceBuffer,
    q_norm: DeviceBuffer,
    k_norm: Option<DeviceBuffer>,
    post_attn_norm: DeviceBuffer,
    ffn_norm: DeviceBuffer,
    post_ffw_norm: DeviceBuffer,
    ple_post_norm: Option<DeviceBuffer>,
}

struct DeviceWeights {
    layers: Vec<LayerWeights>,
    /// `token_embd` as GGUF bytes (the embedding gather).
    embd: GpuTable,
    /// `token_embd` as planes (the tied head).
    head: GpuMatrix,
    output_norm: DeviceBuffer,
    ple_table: Option<GpuTable>,
    ple_model_proj: Option<GpuMatrix>,
    ple_proj_norm: Option<DeviceBuffer>,
    /// f32 `[n_layers]` layer scalars.
    layer_scales: DeviceBuffer,
    /// f64 inverse frequencies per layer kind (`[hd/2]`).
    rope_swa: DeviceBuffer,
    rope_full: DeviceBuffer,
    bytes: u64,
    bf16_bytes: u64,
    converted: Vec<String>,
}

/// A CUDA inference session: one sequence on one GPU.
pub struct CudaEngine<'m> {
    model: &'m Model,
    gpu: Gpu,
    planner: Planner,
    w: DeviceWeights,
    kv: KvCache,
    b: Buffers,
    max_seq: usize,
    ubatch: usize,
    pos: usize,
    /// First layer from which no layer writes a cache: from there on only
    /// the rows whose logits are wanted are carried.
    compact_at: usize,
    use_graph: bool,
    graph: Option<Graph>,
    /// The position the captured graph reads is device-side; this only
    /// records that one exists.
    phases: std::cell::RefCell<Option<Phases>>,
    staging_i32: PinnedBuf<i32>,
    staging_logits: PinnedBuf<f32>,
    /// Per-layer activations, when enabled (tests and debugging).
    trace: Option<crate::cpu::Trace>,
    /// cuBLAS, when a slot is served by the vendor GEMM.
    cublas: Option<gemtune_kernels::reference::Cublas>,
}

fn dev(e: GpuError) -> EngineError {
    EngineError::Device(e.to_string())
}

fn plan_err(e: PlanError) -> EngineError {
    EngineError::Device(e.to_string())
}

impl<'m> CudaEngine<'m> {
    /// Opens the GPU, plans every slot, checks that the model fits, uploads
    /// the weights and allocates the cache and buffers.
    pub fn new(model: &'m Model, opts: CudaOptions) -> Result<CudaEngine<'m>, EngineError> {
        let cfg = model.config();
        check_config(cfg)?;
        let gpu = Gpu::new(opts.device).map_err(dev)?;
        let limits = gpu.limits();
        let tuned = match opts.tuned {
            Some(t) => Some(t),
            None => BUILTIN_TUNED
                .iter()
                .find(|(a, _)| *a == limits.arch.to_string())
                .map(|(a, text)| TunedFile::parse(&format!("builtin:{a}"), text))
                .transpose()
                .map_err(|e| EngineError::Device(e.to_string()))?,
        };
        let kv_type = match (opts.kv_type, &opts.profile.kv_type) {
            (Some(t), _) => t,
            (None, Some(s)) => KvType::from_name(s).ok_or_else(|| {
                EngineError::Device(format!(
                    "profile {}: kv_type '{s}' is not F16, BF16 or F32",
                    opts.profile.name
                ))
            })?,
            (None, None) => KvType::F16,
        };
        let max_seq = opts.max_seq.clamp(1, cfg.context_length.max(1));
        let ubatch = opts.ubatch.clamp(1, max_seq);
        let planner = Planner::new(opts.profile.clone(), tuned, limits);
        let compact_at = (0..=cfg.n_layers)
            .rev()
            .take_while(|&l| l == cfg.n_layers || !cfg.layers[l].owns_kv())
            .last()
            .unwrap_or(cfg.n_layers);

        let layouts = forward::plan_layouts(&planner, cfg, model, ubatch).map_err(plan_err)?;
        let need = forward::planned_bytes(cfg, model, &layouts, max_seq, ubatch, kv_type);
        let (free, total) = gpu.mem_info().map_err(dev)?;
        if need > free as u64 {
            return Err(EngineError::Device(format!(
                "the model does not fit: it needs {need} bytes of device memory ({:.2} GiB: weights, {} KV cache, buffers) and the GPU has {free} bytes free of {total} ({:.2} GiB free)",
                need as f64 / (1u64 << 30) as f64,
                kv_type.name(),
                free as f64 / (1u64 << 30) as f64
            )));
        }
        let w = forward::upload_weights(&gpu, model, &layouts).map_err(dev)?;
        let kv = KvCache::new(&gpu, cfg, max_seq, ubatch, kv_type).map_err(dev)?;
        let scratch = launch::attn_scratch_bytes(cfg, max_seq, ubatch);
        let b = Buffers::new(&gpu, cfg, model.vocab_size(), ubatch, scratch).map_err(dev)?;
        let staging_i32 = PinnedBuf::new(&gpu, ubatch + 4).map_err(dev)?;
        let staging_logits =
            PinnedBuf::new(&gpu, buffers::HEAD_ROWS * model.vocab_size()).map_err(dev)?;
        let any_vendor = forward::KINDS.iter().any(|k| {
            [1, GEMV_ROWS_PLUS_ONE, ubatch]
                .iter()
                .any(|&m| planner.vendor(&forward::slot_for(k, m)))
        });
        let cublas = if any_vendor {
            Some(gemtune_kernels::reference::Cublas::new(&gpu).map_err(|e| {
                EngineError::Device(format!("profile {} uses cuBLAS: {e}", planner.profile.name))
            })?)
        } else {
            None
        };
        let mut e = CudaEngine {
            model,
            gpu,
            planner,
            w,
            kv,
            b,
            max_seq,
            ubatch,
            pos: 0,
            compact_at,
            use_graph: opts.graph,
            graph: None,
            phases: std::cell::RefCell::new(opts.phases.then(Phases::new)),
            staging_i32,
            staging_logits,
            trace: None,
            cublas,
        };
        e.preplan()?;
        e.gpu.synchronize().map_err(dev)?;
        Ok(e)
    }

    /// Plans (compiles and loads) every kernel the chunk and decode paths
    /// launch, so nothing compiles after load.
    fn preplan(&mut self) -> Result<(), EngineError> {
        let mut rows: Vec<usize> = (1..=8).collect();
        rows.push(self.ubatch);
        for r in rows {
            if r <= self.ubatch {
                self.plan_rows(r)?;
            }
        }
        Ok(())
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }
    pub fn kv_type(&self) -> KvType {
        self.kv.kv_type
    }
    /// Device bytes of the KV cache.
    pub fn cache_bytes(&self) -> u64 {
        self.kv.bytes()
    }
    /// Device bytes of the weights (every layout uploaded).
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }
    /// Device bytes of the bf16 weight copies of the cuBLAS profile.
    pub fn extra_bf16_bytes(&self) -> u64 {
        self.w.bf16_bytes
    }
    pub fn buffer_bytes(&self) -> u64 {
        self.b.bytes()
    }
    /// Graph replays so far (tests assert decode replayed the graph).
    pub fn graph_replays(&self) -> u64 {
        self.graph.as_ref().map(|g| g.replays()).unwrap_or(0)
    }
    pub fn ubatch(&self) -> usize {
        self.ubatch
    }
    pub fn decisions(&self) -> Vec<Decision> {
        self.planner.decisions()
    }
}

/// Refuses configs the kernels cannot run, before touching the GPU.
fn check_config(cfg: &Gemma4Config) -> Result<(), EngineError> {
    let bad = |m: String| Err(EngineError::Device(m));
    if cfg.d_model % 32 != 0 {
        return bad(format!(
            "d_model {} is not a multiple of 32 (the quant block)",
            cfg.d_model
        ));
    }
    for l in &cfg.layers {
        if l.n_kv_heads == 0 || l.n_heads % l.n_kv_heads != 0 {
            return bad(format!(
                "layer {}: {} query heads over {} KV heads",
                l.index, l.n_heads, l.n_kv_heads
            ));
        }
        let r = cfg.rope(l.kind);
        if r.dims != l.head_dim {
            return bad(format!(
                "layer {}: RoPE over {} of {} head dims; the qk_norm_rope kernel rotates whole heads",
                l.index, r.dims, l.head_dim
            ));
        }
        if l.ffn_dim % 32 != 0 || l.head_dim % 32 != 0 {
            return bad(format!(
                "layer {}: widths must be multiples of 32 (ffn {}, head dim {})",
                l.index, l.ffn_dim, l.head_dim
            ));
        }
        if l.kind == AttnKind::Sliding && cfg.sliding_window == 0 {
            return bad("a sliding layer with a zero window".into());
        }
    }
    Ok(())
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
        self.max_seq
    }
    fn reset(&mut self) {
        self.pos = 0;
    }
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Logits, EngineError> {
        self.forward_impl(tokens, rows)
    }
    fn set_phases(&mut self, on: bool) -> bool {
        let p = self.phases.get_mut();
        match (on, p.is_some()) {
            (true, false) => *p = Some(Phases::new()),
            (false, true) => *p = None,
            _ => {}
        }
        true
    }
    fn take_phases(&mut self) -> Option<PhaseTimes> {
        self.phases.get_mut().as_mut().map(|p| p.take())
    }
    fn describe(&self) -> Vec<String> {
        let info = self.gpu.info();
        let mut v = vec![
            format!(
                "cuda: {} (sm_{}{}, {} SMs), profile {} ({})",
                info.name,
                info.cc.0,
                info.cc.1,
                info.sm_count,
                self.planner.profile.name,
                self.planner.profile.source
            ),
            format!(
                "device memory: weights {} B, KV cache {} B ({}), buffers {} B; ubatch {}, max_seq {}",
                self.w.bytes,
                self.kv.bytes(),
                self.kv.kv_type.name(),
                self.b.bytes(),
                self.ubatch,
                self.max_seq
            ),
        ];
        if self.w.bf16_bytes > 0 {
            v.push(format!(
                "bf16 weight copies (cuBLAS profile): {} B extra",
                self.w.bf16_bytes
            ));
        }
        for c in &self.w.converted {
            v.push(format!("converted at load: {c}"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for d in self.planner.decisions() {
            let line = format!("{}: {} {} <- {}", d.slot, d.family, d.defines, d.why);
            if seen.insert(format!("{}|{}|{}", d.slot, d.family, d.defines)) {
                v.push(line);
            }
        }
        v
    }
}
