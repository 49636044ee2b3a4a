//! GGUF v2/v3 container: reader (mmap) and writer.
