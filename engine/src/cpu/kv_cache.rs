//! The CPU KV cache: f32 keys (normed, roped) and values (weightless-normed,
//! never roped) for every layer that owns K/V.
//!
//! Layout per layer: `slots × n_kv_heads × head_dim`, position `p` in slot
//! `p % capacity`, with the position each slot holds recorded so a read can
//! prove it gets the key it asked for.
//! - Full layers: `capacity = max_seq` (no wrap).
//! - SWA layers: a ring of `min(max_seq, W + max_batch − 1)` slots. A batch of
//!   at most `max_batch` tokens appends all its K/V before attending, and its
//!   first query still needs the `W − 1` positions before the batch, so that
//!   many slots are exactly enough. The engine cuts longer prefills into
//!   batches of `max_batch`.
//! - KV-shared layers have no entry: they read their donor's cache (the last
//!   non-shared layer of the same kind), so sharing does not depend on any
//!   cache object being "in use".

use crate::config::{AttnKind, Gemma4Config};

const EMPTY: usize = usize::MAX;

/// The cache of one KV-owning layer.
#[derive(Clone, Debug)]
pub struct LayerKv {
    kind: AttnKind,
    n_kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    k: Vec<f32>,
    v: Vec<f32>,
    slot_pos: Vec<usize>,
}

impl LayerKv {
    fn new(kind: AttnKind, n_kv_heads: usize, head_dim: usize, capacity: usize) -> LayerKv {
        let w = n_kv_heads * head_dim;
        LayerKv {
            kind,
            n_kv_heads,
            head_dim,
            capacity,
            k: vec![0.0; capacity * w],
            v: vec![0.0; capacity * w],
            slot_pos: vec![EMPTY; capacity],
        }
    }

    pub fn kind(&self) -> AttnKind {
        self.kind
    }
    pub fn n_kv_heads(&self) -> usize {
        self.n_kv_heads
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Elements per position (all KV heads).
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }
    /// Number of slots (positions held at once).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slot of `pos` if it currently holds `pos`.
    #[inline]
    pub fn slot_of(&self, pos: usize) -> Option<usize> {
        let s = pos % self.capacity;
        (self.slot_pos[s] == pos).then_some(s)
    }

    /// Positions currently held, ascending.
    pub fn positions(&self) -> Vec<usize> {
        let mut p: Vec<usize> = self
            .slot_pos
            .iter()
            .copied()
            .filter(|&p| p != EMPTY)
            .collect();
        p.sort_unstable();
        p
    }

    /// Key of `pos` (all KV heads), if held.
    pub fn k_at(&self, pos: usize) -> Option<&[f32]> {
        let w = self.kv_dim();
        self.slot_of(pos).map(|s| &self.k[s * w..(s + 1) * w])
    }
    /// Value of `pos` (all KV heads), if held.
    pub fn v_at(&self, pos: usize) -> Option<&[f32]> {
        let w = self.kv_dim();
        self.slot_of(pos).map(|s| &self.v[s * w..(s + 1) * w])
    }
    /// Mutable key of `pos` (tests perturb the cache through this).
    pub fn k_at_mut(&mut self, pos: usize) -> Option<&mut [f32]> {
        let w = self.kv_dim();
        self.slot_of(pos)
            .map(move |s| &mut self.k[s * w..(s + 1) * w])
    }
    /// Mutable value of `pos`.
    pub fn v_at_mut(&mut self, pos: usize) -> Option<&mut [f32]> {
        let w = self.kv_dim();
        self.slot_of(pos)
            .map(move |s| &mut self.v[s * w..(s + 1) * w])
    }

    /// Key/value of one KV head at a slot (no position check: hot path).
    #[inline]
    pub(crate) fn kv_head(&self, slot: usize, head: usize) -> (&[f32], &[f32]) {
        let o = (slot * self.n_kv_heads + head) * self.head_dim;
        (&self.k[o..o + self.head_dim], &self.v[o..o + self.head_dim])
    }

    /// Mutable key/value rows for `pos`, claiming its slot.
    pub(crate) fn write_slot(&mut self, pos: usize) -> (&mut [f32], &mut [f32]) {
        let w = self.kv_dim();
        let s = pos % self.capacity;
        self.slot_pos[s] = pos;
        (
            &mut self.k[s * w..(s + 1) * w],
            &mut self.v[s * w..(s + 1) * w],
        )
    }

    fn clear(&mut self) {
        self.slot_pos.fill(EMPTY);
    }
}

/// Caches of all layers.
#[derive(Clone, Debug)]
pub struct KvCache {
    layers: Vec<Option<LayerKv>>,
    owner: Vec<usize>,
}

impl KvCache {
    /// Caches for `cfg` holding up to `max_seq` positions, fed in batches of
    /// at most `max_batch` tokens.
    pub fn new(cfg: &Gemma4Config, max_seq: usize, max_batch: usize) -> KvCache {
        let max_seq = max_seq.max(1);
        let max_batch = max_batch.max(1);
        let layers = cfg
            .layers
            .iter()
            .map(|l| {
                l.owns_kv().then(|| {
                    let cap = cfg.cache_capacity(l.index, max_seq, max_batch);
                    LayerKv::new(l.kind, l.n_kv_heads, l.head_dim, cap)
                })
            })
            .collect();
        let owner = cfg
            .layers
            .iter()
            .map(|l| l.kv_donor.unwrap_or(l.index))
            .collect();
        KvCache { layers, owner }
    }

    /// The layer whose cache layer `l` reads (itself unless KV-shared).
    pub fn owner_of(&self, l: usize) -> usize {
        self.owner[l]
    }

    /// Whether layer `l` has a cache of its own.
    pub fn owns(&self, l: usize) -> bool {
        self.layers.get(l).is_some_and(|c| c.is_some())
    }

    /// Layer `l`'s own cache (`None` on KV-shared layers).
    pub fn layer(&self, l: usize) -> Option<&LayerKv> {
        self.layers.get(l).and_then(|c| c.as_ref())
    }

    /// Layer `l`'s own cache, mutable.
    pub fn layer_mut(&mut self, l: usize) -> Option<&mut LayerKv> {
        self.layers.get_mut(l).and_then(|c| c.as_mut())
    }

    /// The cache layer `l` attends over (its donor's on KV-shared layers).
    pub fn for_layer(&self, l: usize) -> &LayerKv {
        self.layers[self.owner[l]]
            .as_ref()
            .expect("KvCache: a layer's cache owner always owns a cache")
    }

    /// Number of layers with a cache of their own.
    pub fn n_owned(&self) -> usize {
        self.layers.iter().filter(|c| c.is_some()).count()
    }

    /// Total bytes of K and V storage.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flatten()
            .map(|c| (c.k.len() + c.v.len()) * 4)
            .sum()
    }

    /// Forget every position (storage is kept).
    pub fn clear(&mut self) {
        for c in self.layers.iter_mut().flatten() {
            c.clear();
        }
    }
}
