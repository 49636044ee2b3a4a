//! The built-in demo model: what `gemtune run` (and `tokenize`, `logits`,
//! `demo`) use without `-m`.
//!
//! It is the `tiny` preset (d 128, 6 layers with sliding and full attention,
//! KV sharing, k_eq_v full layers, per-layer embeddings, vocab 2048 of the
//! synthetic BPE vocab) stored as `gemtune synth tiny q8_0` stores it, with
//! weights trained on the English prose of `engine/data/corpus/` (text
//! written for this repository) instead of random ones, so its greedy text
//! is words, not noise. Four million parameters and about seven thousand
//! tokens of training text: it retells its corpus and introduces itself when
//! greeted; it does not answer questions. `scripts/demo-model/build.sh`
//! rebuilds the file (training script, template and assembly).

use super::SynthError;
use crate::gguf::GgufFile;

/// The demo model's GGUF, compiled into the binary (4.5 MB).
const DEMO_GGUF: &[u8] = include_bytes!("../../data/demo/gemma4-tiny-demo.gguf");

/// Label of the built-in model's in-memory file.
pub const BUILTIN_MODEL_LABEL: &str = "builtin:gemma4-tiny-demo";

/// The built-in demo model's file.
pub fn builtin_model() -> Result<GgufFile, SynthError> {
    Ok(GgufFile::from_bytes(
        DEMO_GGUF.to_vec(),
        BUILTIN_MODEL_LABEL,
    )?)
}

/// One line naming the built-in model for users (the first output line of
/// `run` without `-m`, the README and `demo`).
pub fn builtin_model_description() -> &'static str {
    "built-in demo model: Gemma 4 tiny (d 128, 6 layers, 4.3 M parameters, Q8_0) \
     trained on a few pages of English prose; it retells them"
}
