//! The CUDA forward pass: Gemma 4 on the GPU from the harness's own kernel
//! families, launched through their `bind` calling conventions.
//!
//! The modules, leaf first (each imports only those above it):
//! - `slots`: the names of slots, projections and phases, as types;
//! - `planner`: profile + tuned table + device limits -> the variant of a
//!   slot at a problem (no GPU work);
//! - `weights`: the device copy of a model in the layouts the plan reads;
//! - `model_dims`: the model's matrix shapes and device types, and the
//!   device bytes of its weights in a plan's layouts (no GPU);
//! - `forward_plan`: every launch of the forward pass per row bucket,
//!   resolved at load (`ForwardPlan`), and loaded once;
//! - `step_reads`: what a decode step of the plan reads (bench's floor);
//! - `kv_cache`, `buffers`, `phases`: the cache, the fixed-address
//!   activation buffers, the per-phase event timing (eager, and inside a
//!   timed decode graph);
//! - `engine`: `CudaEngine` and its construction;
//! - `stages`: the Gemma 4 stages executing a bucket's plan (embed,
//!   per-layer inputs, input norm, attention block, attention residual,
//!   FFN block, PLE injection, layer end, head);
//! - `forward`: the chunk loop and the captured decode graph.
//!
//! Everything is allocated and compiled at load; a forward pass asks the
//! planner nothing. The only per-token traffic over the bus is the token id
//! and position (in) and the logits rows (out).

mod buffers;
mod engine;
mod forward;
pub mod forward_plan;
mod kv_cache;
mod launch_chain;
pub mod model_dims;
mod moe;
mod phases;
pub mod planner;
pub mod slots;
mod stages;
pub mod step_reads;
mod weights;

pub use engine::{weight_plan, CudaEngine, CudaOptions, WeightPlan, BUILTIN_TUNED, DEFAULT_UBATCH};
pub use kv_cache::cache_bytes;
pub use planner::{Decision, PlanError, Planner};
pub use slots::PHASES;
