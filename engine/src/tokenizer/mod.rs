//! The `gemma4` BPE tokenizer and chat template.
