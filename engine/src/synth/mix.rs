//! The tensor types of a synthetic file: for the k-quant file types, the mix
//! llama.cpp's quantizer (`llama_tensor_get_type` in `src/llama-quant.cpp`)
//! writes for a Gemma 4 model; `docs/gemma4.md` §4.3 is the table.
//!
//! The rules, for a `gemma4` file (tied embeddings, not Falcon, no
//! imatrix, no overrides, not 8 experts: llama.cpp special-cases 8-expert
//! models, which no Gemma 4 is), in the order llama.cpp applies them:
//! - only 2-D and 3-D (expert stack) tensors whose names end in `weight`
//!   are quantized, never a `*_norm.weight`, never the MoE router
//!   `ffn_gate_inp.weight` (the converter writes it F32), and never
//!   `per_layer_model_proj.weight`, which keeps the source file's type (the
//!   converter's default for Gemma's bf16 checkpoints is BF16);
//! - the file type's base type: Q4_K (q4_k_m), Q5_K (q5_k_m), Q6_K (q6_k);
//! - tied embeddings: `token_embd` and `per_layer_token_embd` take the output
//!   tensor's rule, Q6_K (Q8_0 when a row is not whole 256-element
//!   super-blocks);
//! - `attn_v`: in q4_k_m and q5_k_m, Q6_K when `use_more_bits(i, n)` holds
//!   for its rank `i` among the file's `n` attn_v tensors in layer order
//!   (KV-shared layers keep theirs, so they count; k_eq_v layers have none);
//! - `ffn_down` of layer `i` of `n`, and on a MoE model `ffn_down_exps`
//!   too (llama.cpp reads the layer from the name when the model has
//!   experts, so both of a layer's down tensors share its rule): in q4_k_m
//!   and q5_k_m, Q6_K when `use_more_bits(i, n)`;
//! - everything else (attn_q, attn_k, attn_output, ffn_gate, ffn_up, the
//!   expert `ffn_gate_up_exps` / `ffn_gate_exps` / `ffn_up_exps`, the PLE
//!   `inp_gate` and `proj`) the base type;
//! - last, a row (ne0) that is not a whole number of the chosen type's
//!   blocks falls back: Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, and to F16
//!   when even 32 does not divide it (only the tiny test model hits this).
//!
//! `use_more_bits(i, n) = i < n/8 || i >= 7n/8 || (i - n/8) % 3 == 2`
//! (integer division). The 16-bit and legacy file types are uniform: every
//! matrix in the file's type (f16, bf16, f32), or Q8_0 / Q4_0 matrices with
//! the embedding tables of `WeightType::embedding_type`.

use super::WeightType;
use crate::plan::{TensorRole, TensorSpec};
use gemtune_kernels::quant::GgmlType;

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and
/// every third one between get more bits.
pub fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The type a row of `ncols` elements falls back to when `ty`'s blocks do
/// not divide it (llama.cpp's `tensor_type_fallback`).
pub fn fallback(ty: GgmlType, ncols: u64) -> GgmlType {
    if ncols % ty.block_size() as u64 == 0 {
        return ty;
    }
    let f = match ty {
        GgmlType::Q4K => GgmlType::Q5_0,
        GgmlType::Q5K => GgmlType::Q5_1,
        GgmlType::Q6K => GgmlType::Q8_0,
        other => other,
    };
    if ncols % f.block_size() as u64 == 0 {
        f
    } else {
        GgmlType::F16
    }
}

/// The kind of a tensor name, as llama.cpp's `tensor_get_category` sorts
/// the names a Gemma 4 file has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    TokenEmbd,
    AttnV,
    FfnDown,
    Other,
}

fn kind(name: &str) -> Kind {
    if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        Kind::TokenEmbd
    } else if name.contains("attn_v.weight") {
        Kind::AttnV
    } else if name.contains("ffn_down") {
        Kind::FfnDown
    } else {
        Kind::Other
    }
}

/// The storage type of every tensor of `plan` in a file of type `w`, for a
/// model of `n_layers` layers (plan order).
pub fn tensor_types(plan: &[TensorSpec], n_layers: usize, w: WeightType) -> Vec<GgmlType> {
    let base = match w {
        WeightType::Q4KM => GgmlType::Q4K,
        WeightType::Q5KM => GgmlType::Q5K,
        WeightType::Q6K => GgmlType::Q6K,
        _ => return plan.iter().map(|s| super::tensor_type(s, w)).collect(),
    };
    let mixed = matches!(w, WeightType::Q4KM | WeightType::Q5KM);
    // The rank of each attn_v tensor among the file's, in layer order (the
    // order llama.cpp's loader sorts tensors in).
    let mut attn_v: Vec<(usize, usize)> = plan
        .iter()
        .enumerate()
        .filter(|(_, s)| kind(&s.name) == Kind::AttnV)
        .map(|(i, s)| (s.layer.unwrap_or(0), i))
        .collect();
    attn_v.sort();
    let n_attn_v = attn_v.len();
    let rank = |i: usize| attn_v.iter().position(|&(_, j)| j == i).unwrap_or(0);
    plan.iter()
        .enumerate()
        .map(|(i, s)| {
            if !matches!(
                s.role,
                TensorRole::Matrix | TensorRole::Embedding | TensorRole::Experts
            ) {
                return GgmlType::F32;
            }
            if s.name == "per_layer_model_proj.weight" {
                return GgmlType::Bf16;
            }
            let ncols = s.dims[0];
            let ty = match kind(&s.name) {
                Kind::TokenEmbd if ncols % base.block_size() as u64 != 0 => GgmlType::Q8_0,
                Kind::TokenEmbd => GgmlType::Q6K,
                Kind::AttnV if mixed && use_more_bits(rank(i), n_attn_v) => GgmlType::Q6K,
                Kind::FfnDown if mixed && use_more_bits(s.layer.unwrap_or(0), n_layers) => {
                    GgmlType::Q6K
                }
                _ => base,
            };
            fallback(ty, ncols)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_more_bits_matches_llama_cpp_for_gemma_layer_counts() {
        let more = |n: usize| -> Vec<usize> { (0..n).filter(|&i| use_more_bits(i, n)).collect() };
        // n = 42 (E4B): n/8 = 5, 7n/8 = 36.
        assert_eq!(
            more(42),
            vec![0, 1, 2, 3, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 34, 36, 37, 38, 39, 40, 41]
        );
        // n = 6 (tiny): n/8 = 0, 7n/8 = 5.
        assert_eq!(more(6), vec![2, 5]);
    }

    #[test]
    fn fallbacks_follow_the_block_sizes() {
        assert_eq!(fallback(GgmlType::Q4K, 2560), GgmlType::Q4K);
        assert_eq!(fallback(GgmlType::Q4K, 128), GgmlType::Q5_0);
        assert_eq!(fallback(GgmlType::Q5K, 32), GgmlType::Q5_1);
        assert_eq!(fallback(GgmlType::Q6K, 192), GgmlType::Q8_0);
        assert_eq!(fallback(GgmlType::Q6K, 48), GgmlType::F16);
        assert_eq!(fallback(GgmlType::Bf16, 7), GgmlType::Bf16);
    }
}
