//! The device KV cache: per KV-owning layer, K and V as
//! `[capacity][n_kv_heads][head_dim]` of the cache type, position `p` in
//! slot `p % capacity` (the layout `qk_norm_rope` writes and the attention
//! kernels read; `docs/calling-convention.md`).
//!
//! Capacities are `Gemma4Config::cache_capacity` at the engine's chunk size:
//! a linear cache of `max_seq` slots on full layers, a ring of
//! `min(max_seq, window + ubatch - 1)` on sliding ones. KV-shared layers own
//! nothing: they read their donor's buffers.

use gemtune_kernels::family::KvType;
use gemtune_kernels::gpu::{DeviceBuffer, Gpu, GpuError};

use super::forward_plan::Sizing;
use crate::config::Gemma4Config;

/// One KV-owning layer's cache.
pub struct LayerCache {
    pub capacity: usize,
    pub k: DeviceBuffer,
    pub v: DeviceBuffer,
}

/// The caches of a model.
pub struct KvCache {
    pub kv_type: KvType,
    /// Indexed by layer; `None` for KV-shared layers.
    layers: Vec<Option<LayerCache>>,
    /// The layer whose cache each layer reads (itself or its donor).
    source: Vec<usize>,
}

/// Slots of each KV-owning layer's cache for a model and the engine's
/// sizes (`None` on KV-shared layers).
pub fn capacities(cfg: &Gemma4Config, max_seq: usize, ubatch: usize) -> Vec<Option<usize>> {
    cfg.layers
        .iter()
        .map(|l| {
            l.owns_kv()
                .then(|| cfg.cache_capacity(l.index, max_seq, ubatch))
        })
        .collect()
}

/// Bytes the caches take (what `info` and `run -v` print).
pub fn cache_bytes(cfg: &Gemma4Config, max_seq: usize, ubatch: usize, t: KvType) -> u64 {
    capacities(cfg, max_seq, ubatch)
        .iter()
        .zip(&cfg.layers)
        .filter_map(|(c, l)| c.map(|c| 2 * (c * l.kv_dim() * t.bytes()) as u64))
        .sum()
}

impl KvCache {
    pub fn new(gpu: &Gpu, cfg: &Gemma4Config, s: &Sizing) -> Result<KvCache, GpuError> {
        let kv_type = s.kv_type;
        let caps = capacities(cfg, s.max_seq, s.ubatch);
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for (l, cap) in cfg.layers.iter().zip(&caps) {
            layers.push(match cap {
                None => None,
                Some(c) => {
                    let bytes = c * l.kv_dim() * kv_type.bytes();
                    let k = gpu.alloc(bytes)?;
                    let v = gpu.alloc(bytes)?;
                    // Unwritten slots are never read (masks and lengths keep
                    // every read below the written positions); zero them so
                    // a bug reads zeros, not stale memory.
                    gpu.fill_u32(&k, 0)?;
                    gpu.fill_u32(&v, 0)?;
                    Some(LayerCache { capacity: *c, k, v })
                }
            });
        }
        let source = cfg
            .layers
            .iter()
            .map(|l| l.kv_donor.unwrap_or(l.index))
            .collect();
        Ok(KvCache {
            kv_type,
            layers,
            source,
        })
    }

    /// The cache layer `l` reads (its donor's on KV-shared layers).
    pub fn for_layer(&self, l: usize) -> Option<&LayerCache> {
        self.layers.get(*self.source.get(l)?)?.as_ref()
    }

    /// Whether layer `l` writes a cache.
    pub fn owns(&self, l: usize) -> bool {
        matches!(self.layers.get(l), Some(Some(_)))
    }

    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|c| (c.k.bytes() + c.v.bytes()) as u64)
            .sum()
    }
}
