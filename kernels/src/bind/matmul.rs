//! Calling convention of the matmul families (`quantize_q8_1`, `gemv`,
//! `mmq`, `gemm_dq`, `gemm_wgmma`): see `docs/calling-convention.md`.
