//! CPU reference ops (f64 accumulation, no unsafe, no GPU).
