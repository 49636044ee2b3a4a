//! CPU reference forward pass.
//!
//! - `forward`: `CpuEngine`, batched prefill and decode in one code path.
//! - `kv_cache`: per-layer f32 K/V, ring buffers on sliding layers, donors
//!   for KV-shared layers.
//! - `attention`: masked (causal / sliding-window) GQA attention over a cache.
//! - `matmul`: rayon-parallel quantized matmul.
//! - `moe`: the mixture-of-experts FFN block (router, top-k routing with its
//!   tie rule, shared MLP, experts).
//! - `rope`: NeoX RoPE rotation with the shared frequencies (`crate::rope`).
//! - `ops`: RMSNorm, GELU, softcap, dot products.

pub mod attention;
pub mod forward;
pub mod kv_cache;
pub mod matmul;
pub mod moe;
pub mod ops;
pub mod rope;

pub use forward::{CpuEngine, CpuOptions, LayerTrace, RowsRun, Trace};
pub use kv_cache::{KvCache, LayerKv};
