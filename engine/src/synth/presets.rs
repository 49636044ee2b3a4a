//! The published Gemma 4 text-decoder configs (spec §2) and `tiny`, a
//! CPU-milliseconds model with every feature of the dense family, and
//! `tiny-moe`, the same for the mixture-of-experts 26B-A4B.

use crate::config::{
    proportional_rope_factors, resolve_kv_donors, AttnKind, Gemma4Config, LayerConfig, MoeConfig,
    RopeConfig,
};

/// Published vocab of every released variant.
pub const GEMMA4_VOCAB: usize = 262_144;
/// Vocab of `tiny`.
pub const TINY_VOCAB: usize = 2048;

/// Head dims shared by every variant: 256 on SWA layers, 512 on full layers.
const HD_SWA: usize = 256;
const HD_FULL: usize = 512;

/// Everything a preset varies; the rest is common to the family.
struct Shape {
    name: &'static str,
    d_model: usize,
    /// `true` = SWA, one per layer.
    pattern: Vec<bool>,
    n_heads: usize,
    kv_swa: usize,
    kv_full: usize,
    /// Full layers have no `attn_v` (V = raw K projection).
    k_eq_v_full: bool,
    ffn: Vec<usize>,
    window: usize,
    ple_dim: usize,
    n_shared: usize,
    context: usize,
    vocab: usize,
    /// The MoE FFN beside the dense shared MLP (`ffn`), on every layer.
    moe: Option<MoeConfig>,
}

/// `groups` repetitions of `swa` SWA layers followed by one full layer.
fn pattern(swa: usize, groups: usize) -> Vec<bool> {
    (0..groups)
        .flat_map(|_| std::iter::repeat_n(true, swa).chain(std::iter::once(false)))
        .collect()
}

fn build(s: Shape) -> Gemma4Config {
    let n_layers = s.pattern.len();
    let kinds: Vec<AttnKind> = s
        .pattern
        .iter()
        .map(|&swa| {
            if swa {
                AttnKind::Sliding
            } else {
                AttnKind::Full
            }
        })
        .collect();
    // Presets are written so that every shared layer has a donor.
    let donors = resolve_kv_donors(&kinds, s.n_shared)
        .unwrap_or_else(|l| unreachable!("preset {} has no KV donor for layer {l}", s.name));
    let layers = kinds
        .iter()
        .enumerate()
        .map(|(i, &kind)| {
            let full = kind == AttnKind::Full;
            LayerConfig {
                index: i,
                kind,
                head_dim: if full { HD_FULL } else { HD_SWA },
                n_heads: s.n_heads,
                n_kv_heads: if full { s.kv_full } else { s.kv_swa },
                ffn_dim: s.ffn[i],
                kv_donor: donors[i],
                k_eq_v: full && s.k_eq_v_full,
                has_layer_scale: true,
            }
        })
        .collect();
    Gemma4Config {
        name: Some(format!("gemma4-{}-synth", s.name)),
        d_model: s.d_model,
        n_layers,
        vocab_size: s.vocab,
        context_length: s.context,
        sliding_window: s.window,
        rms_eps: 1e-6,
        ple_dim: s.ple_dim,
        n_kv_shared_layers: s.n_shared,
        final_logit_softcap: Some(30.0),
        rope_swa: RopeConfig {
            freq_base: 10_000.0,
            dims: HD_SWA,
            freq_factors: None,
        },
        rope_full: RopeConfig {
            freq_base: 1_000_000.0,
            dims: HD_FULL,
            freq_factors: Some(proportional_rope_factors(HD_FULL)),
        },
        layers,
        moe: s.moe,
    }
}

/// tiny: d 128, 6 layers [S,S,F,S,S,F], 4 query heads, KV heads
/// [2,2,1,2,2,1], window 8, the last 2 layers KV-shared (4 -> 3, 5 -> 2),
/// FFN 256 (512 on shared layers), PLE 32, k_eq_v on full layers.
pub fn tiny() -> Gemma4Config {
    let n_shared = 2;
    let n_layers = 6;
    build(Shape {
        name: "tiny",
        d_model: 128,
        pattern: pattern(2, 2),
        n_heads: 4,
        kv_swa: 2,
        kv_full: 1,
        k_eq_v_full: true,
        ffn: (0..n_layers)
            .map(|i| if i >= n_layers - n_shared { 512 } else { 256 })
            .collect(),
        window: 8,
        ple_dim: 32,
        n_shared,
        context: 512,
        vocab: TINY_VOCAB,
        moe: None,
    })
}

/// E2B: 35 layers, 4 SWA + 1 full, 20 KV-shared layers with a double-wide
/// FFN (12288) on them.
pub fn e2b() -> Gemma4Config {
    build(Shape {
        name: "e2b",
        d_model: 1536,
        pattern: pattern(4, 7),
        n_heads: 8,
        kv_swa: 1,
        kv_full: 1,
        k_eq_v_full: false,
        ffn: (0..35)
            .map(|i| if i >= 15 { 12288 } else { 6144 })
            .collect(),
        window: 512,
        ple_dim: 256,
        n_shared: 20,
        context: 131_072,
        vocab: GEMMA4_VOCAB,
        moe: None,
    })
}

/// E4B: 42 layers, 5 SWA + 1 full, 18 KV-shared layers.
pub fn e4b() -> Gemma4Config {
    build(Shape {
        name: "e4b",
        d_model: 2560,
        pattern: pattern(5, 7),
        n_heads: 8,
        kv_swa: 2,
        kv_full: 2,
        k_eq_v_full: false,
        ffn: vec![10240; 42],
        window: 512,
        ple_dim: 256,
        n_shared: 18,
        context: 131_072,
        vocab: GEMMA4_VOCAB,
        moe: None,
    })
}

/// 12B: 48 layers, 5 SWA + 1 full, KV heads 8 (SWA) / 1 (full, k_eq_v).
pub fn b12() -> Gemma4Config {
    build(Shape {
        name: "12b",
        d_model: 3840,
        pattern: pattern(5, 8),
        n_heads: 16,
        kv_swa: 8,
        kv_full: 1,
        k_eq_v_full: true,
        ffn: vec![15360; 48],
        window: 1024,
        ple_dim: 0,
        n_shared: 0,
        context: 262_144,
        vocab: GEMMA4_VOCAB,
        moe: None,
    })
}

/// 31B: 60 layers, 5 SWA + 1 full, KV heads 16 (SWA) / 4 (full, k_eq_v).
pub fn b31() -> Gemma4Config {
    build(Shape {
        name: "31b",
        d_model: 5376,
        pattern: pattern(5, 10),
        n_heads: 32,
        kv_swa: 16,
        kv_full: 4,
        k_eq_v_full: true,
        ffn: vec![21504; 60],
        window: 1024,
        ple_dim: 0,
        n_shared: 0,
        context: 262_144,
        vocab: GEMMA4_VOCAB,
        moe: None,
    })
}

/// 26B-A4B: 30 layers, 5 SWA + 1 full, KV heads 8 (SWA) / 2 (full,
/// k_eq_v), a dense shared MLP of 2112 and 128 experts of 704, top-8, on
/// every layer (fused `ffn_gate_up_exps`, as current conversions write it).
pub fn b26_a4b() -> Gemma4Config {
    build(Shape {
        name: "26b-a4b",
        d_model: 2816,
        pattern: pattern(5, 5),
        n_heads: 16,
        kv_swa: 8,
        kv_full: 2,
        k_eq_v_full: true,
        ffn: vec![2112; 30],
        window: 1024,
        ple_dim: 0,
        n_shared: 0,
        context: 262_144,
        vocab: GEMMA4_VOCAB,
        moe: Some(MoeConfig {
            n_experts: 128,
            n_experts_used: 8,
            expert_ffn_dim: 704,
            gate_up_fused: true,
        }),
    })
}

/// tiny-moe: every feature of 26B-A4B at CPU-milliseconds size. d 128, 6
/// layers [S,S,F,S,S,F], 4 query heads, KV heads [2,2,1,2,2,1] (k_eq_v on
/// full layers), window 8, shared MLP 256, 6 experts of 96, top-2, no PLE,
/// no KV sharing. Six experts, not eight: llama.cpp's quantizer
/// special-cases 8-expert models (Mixtral) in its k-quant mixes.
pub fn tiny_moe() -> Gemma4Config {
    build(Shape {
        name: "tiny-moe",
        d_model: 128,
        pattern: pattern(2, 2),
        n_heads: 4,
        kv_swa: 2,
        kv_full: 1,
        k_eq_v_full: true,
        ffn: vec![256; 6],
        window: 8,
        ple_dim: 0,
        n_shared: 0,
        context: 512,
        vocab: TINY_VOCAB,
        moe: Some(MoeConfig {
            n_experts: 6,
            n_experts_used: 2,
            expert_ffn_dim: 96,
            gate_up_fused: true,
        }),
    })
}
