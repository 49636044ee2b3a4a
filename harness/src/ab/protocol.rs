//! The worker protocol of `gemtune bench --worker`.
//!
//! The worker is spawned as `BIN bench --worker [-m MODEL] [--profile P]
//! [--backend B] [--ubatch N] [--kv-type T]`. stdin and stdout carry one
//! JSON object per line; stderr is free-form progress (`ab` logs it and
//! quotes its tail on errors).
//!
//! 1. When loaded, the worker writes `Ready` (`{"ready":true,...}`).
//! 2. Each request gets exactly one reply line:
//!    - `{"op":"logits","tokens":[...],"rows":"all","path":"/tmp/x.f32"}`:
//!      resets the sequence, runs the tokens, writes rows x vocab
//!      little-endian f32 to `path`; reply `{"ok":true,"rows":R,"vocab":V}`.
//!    - `{"op":"bench","n_prompt":P,"n_gen":N,"depth":D,"phases":B}`: resets,
//!      fills D tokens untimed, times a prefill of P tokens, then N
//!      single-token decode steps; reply `BenchReply`, with per-phase GPU
//!      times when B is true.
//!    - `{"op":"quit"}`: the worker exits 0 (a reply line is optional).
//! 3. A failed request is answered `{"ok":false,"error":"..."}`.
//!
//! Anything else on stdout (a line that is not a JSON object, a reply
//! without `ok`, a reply missing a field) is a protocol violation, and so is
//! a worker that exits or stays silent past the timeout: `ab` stops with
//! exit 4.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub wtype: String,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub params: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub sm_count: u32,
}

/// The worker's first line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ready {
    pub ready: bool,
    #[serde(default)]
    pub version: String,
    /// The revision the worker was built from ("" when unknown).
    #[serde(default)]
    pub git: String,
    #[serde(default)]
    pub model: ModelInfo,
    #[serde(default)]
    pub backend: String,
    #[serde(default)]
    pub profile: String,
    #[serde(default)]
    pub gpu: GpuInfo,
    /// Positions the worker's context holds (0: not said); the numerics
    /// gate clips its prompts to it.
    #[serde(default)]
    pub ctx: usize,
    /// Engine slot -> "family/variant" the profile put there.
    #[serde(default)]
    pub slots: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LogitsReply {
    pub rows: usize,
    pub vocab: usize,
}

/// Per-phase GPU times: `prefill` in ms per prefill, `decode` in ms per
/// decode step. The phase names are the engine's (an open map).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Phases {
    #[serde(default)]
    pub prefill: BTreeMap<String, f64>,
    #[serde(default)]
    pub decode: BTreeMap<String, f64>,
}

/// NVML clocks sampled during the rep (all optional: a worker without NVML
/// sends none).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Clocks {
    #[serde(default)]
    pub sm_mhz_min: Option<f64>,
    #[serde(default)]
    pub sm_mhz_mean: Option<f64>,
    #[serde(default)]
    pub mem_mhz: Option<f64>,
    #[serde(default)]
    pub temp_c_max: Option<f64>,
    #[serde(default)]
    pub power_w_mean: Option<f64>,
    /// Clock-event reasons seen during the rep, comma-separated ("" none).
    #[serde(default)]
    pub throttle: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BenchReply {
    pub pp_tps: f64,
    pub tg_tps: f64,
    /// The prefill's time and the decode steps' total time, ms.
    pub pp_ms: f64,
    pub tg_ms: f64,
    #[serde(default)]
    pub phases: Phases,
    #[serde(default)]
    pub clocks: Option<Clocks>,
}

/// A `logits` request.
pub fn logits_request(tokens: &[u32], path: &std::path::Path) -> serde_json::Value {
    serde_json::json!({
        "op": "logits",
        "tokens": tokens,
        "rows": "all",
        "path": path.to_string_lossy(),
    })
}

/// A `bench` request. With `phases`, the worker also times each forward
/// phase with CUDA events; that runs decode eagerly (no graph), so such a
/// reply serves attribution only, never the verdict.
pub fn bench_request(
    n_prompt: usize,
    n_gen: usize,
    depth: usize,
    phases: bool,
) -> serde_json::Value {
    serde_json::json!({"op": "bench", "n_prompt": n_prompt, "n_gen": n_gen, "depth": depth, "phases": phases})
}

pub fn quit_request() -> serde_json::Value {
    serde_json::json!({"op": "quit"})
}
