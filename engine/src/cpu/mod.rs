//! CPU reference forward pass.
