//! A loaded model: GGUF file, config, tokenizer and weight views.
