//! Calling convention of the attention families (`attn_prefill`,
//! `attn_decode`): see `docs/calling-convention.md`.
