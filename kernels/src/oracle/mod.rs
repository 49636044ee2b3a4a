//! CPU reference ops (f64 accumulation, no unsafe, no GPU).
//!
//! These are the definitions every faster path is judged against, so they
//! favour being obviously right over being fast: plain loops, every sum in
//! f64, f32 only at the boundaries (inputs and results are f32 tensors, as in
//! the engine). Shapes are the caller's contract: a length that disagrees
//! with the stated shape is a programming error and panics with a message
//! naming the argument.

mod activation;
mod attention;
mod ffn;
mod matmul;
mod moe;
mod norm;
mod rope;

pub use activation::{gelu_tanh, softcap, softmax};
pub use attention::{attention, AttnParams};
pub use ffn::gated_ffn;
pub use matmul::{matmul, matmul_quant};
pub use moe::{
    combine_experts, expert_hidden, group_by_expert, moe_ffn, route, route_topk, route_weights,
    MoeGrouping, Routing, ROUTE_MIN_SUM,
};
pub use norm::{rms_inv, rms_norm};
pub use rope::{proportional_freq_factors, rope_inv_freq, rope_neox};

/// Panics with a uniform message when a slice has the wrong length.
#[track_caller]
pub(crate) fn check_len(what: &str, actual: usize, expected: usize) {
    assert!(
        actual == expected,
        "oracle: {what} has {actual} elements, expected {expected}"
    );
}
