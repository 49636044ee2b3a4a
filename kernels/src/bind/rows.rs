//! Calling convention of the row-wise families (`rmsnorm`, `qk_norm_rope`,
//! `gelu_mul`, `embed`, `ple`, `softcap`): see `docs/calling-convention.md`.
