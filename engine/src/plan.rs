//! Expected tensors of a Gemma 4 GGUF, derived from the config.
