//! gemtune-engine: Gemma 4 inference (GGUF in, text out).
//!
//! - `gguf`: memory-mapped GGUF v2/v3 reader and a streaming writer.
//! - `config`: `Gemma4Config`, resolved per layer from GGUF metadata.
//! - `plan`: every tensor a Gemma 4 file holds, with its shape; validation.
//! - `synth`: random-weight models with the exact layout of published files.
//! - `tokenizer`: the `gemma4` BPE tokenizer and the chat template.
//! - `sampler`: greedy / temperature / top-k / top-p / min-p sampling.
//! - `model`: a loaded model (file, config, tokenizer, weight views).
//! - `cpu`: the CPU reference forward pass and its KV cache.
//! - `tuned`: tuned tables (per-shape kernel winners) as the engine reads them.
//! - `step_bytes`: the bytes one decode step must move (bench's floor).
//! - `work`: the rows and FLOPs of a forward pass (bench's GFLOP per token).

pub mod config;
pub mod cpu;
pub mod cuda;
pub mod engine;
pub mod forward;
pub mod gguf;
pub mod model;
pub mod plan;
pub mod profile;
pub mod rope;
pub mod sampler;
pub mod step_bytes;
pub mod synth;
pub mod tokenizer;
pub mod tuned;
pub mod work;
