//! Synthetic Gemma 4 models with the exact layout of the published files.
