//! The k-quant synth mixes (`synth::mix`) against the table in
//! docs/gemma4.md §4.3: for every published size and mix, which layers'
//! `ffn_down` and `attn_v` are Q6_K, and the file's tensor bytes by type.
//! The doc's rows are parsed, so the documented table and the code cannot
//! drift apart.

use gemtune_engine::plan::tensor_plan;
use gemtune_engine::synth::mix::tensor_types;
use gemtune_engine::synth::{preset, SynthVariant, WeightType};
use gemtune_kernels::quant::GgmlType;
use std::collections::BTreeMap;

/// "0-4, 7, 10" style list of sorted layer indices.
fn ranges(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}-{}", v[i], v[j])
        } else if j == i + 1 {
            format!("{}, {}", v[i], v[j])
        } else {
            v[i].to_string()
        });
        i = j + 1;
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(", ")
    }
}

/// The doc row of one model and mix: `| model | mix | ffn_down Q6_K layers |
/// attn_v Q6_K layers | bytes by type |`.
fn row(v: SynthVariant, w: WeightType) -> String {
    let cfg = preset(v);
    let plan = tensor_plan(&cfg);
    let types = tensor_types(&plan, cfg.n_layers, w);
    let mut down = Vec::new();
    let mut attn_v = Vec::new();
    let mut bytes: BTreeMap<GgmlType, u64> = BTreeMap::new();
    for (s, ty) in plan.iter().zip(&types) {
        let layer = s.layer.unwrap_or(usize::MAX);
        if s.name.ends_with("ffn_down.weight") && *ty == GgmlType::Q6K {
            down.push(layer);
        }
        if s.name.ends_with("attn_v.weight") && *ty == GgmlType::Q6K {
            attn_v.push(layer);
        }
        *bytes.entry(*ty).or_default() += ty.row_bytes(s.n_elements()).expect("whole blocks");
    }
    let by_type: Vec<String> = bytes
        .iter()
        .map(|(t, b)| format!("{} {b}", t.name().to_ascii_uppercase()))
        .collect();
    format!(
        "| {} | {} | {} | {} | {} |",
        v.name(),
        w.name(),
        ranges(&down),
        ranges(&attn_v),
        by_type.join(", ")
    )
}

#[test]
fn mixes_match_the_documented_table() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/gemma4.md"))
        .expect("docs/gemma4.md");
    let mut missing = Vec::new();
    let mut count = 0;
    for v in [
        SynthVariant::E2b,
        SynthVariant::E4b,
        SynthVariant::B12,
        SynthVariant::B31,
        SynthVariant::B26A4b,
    ] {
        for w in [WeightType::Q4KM, WeightType::Q5KM, WeightType::Q6K] {
            let r = row(v, w);
            count += 1;
            if !doc.lines().any(|l| l.trim() == r) {
                missing.push(r);
            }
        }
    }
    // Every documented row of the table is one the code produces.
    let documented = doc
        .lines()
        .filter(|l| {
            ["| e2b |", "| e4b |", "| 12b |", "| 31b |", "| 26b-a4b |"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .count();
    assert!(
        missing.is_empty(),
        "docs/gemma4.md §4.3 lacks these rows (or has them different):\n{}",
        missing.join("\n")
    );
    assert_eq!(
        documented, count,
        "the table has rows the code does not produce"
    );
}

/// The rules of docs/gemma4.md §4.3 checked tensor by tensor on E4B (every
/// kind of tensor the mixes treat apart) and on tiny (the fallbacks).
#[test]
fn mix_rules_tensor_by_tensor() {
    let cfg = preset(SynthVariant::E4b);
    let plan = tensor_plan(&cfg);
    for (w, base) in [
        (WeightType::Q4KM, GgmlType::Q4K),
        (WeightType::Q5KM, GgmlType::Q5K),
        (WeightType::Q6K, GgmlType::Q6K),
    ] {
        let types = tensor_types(&plan, cfg.n_layers, w);
        for (s, ty) in plan.iter().zip(&types) {
            let want = if s.dims.len() == 1 {
                GgmlType::F32
            } else if s.name == "per_layer_model_proj.weight" {
                GgmlType::Bf16
            } else if s.name.contains("token_embd") {
                GgmlType::Q6K
            } else if s.name.ends_with("ffn_down.weight") || s.name.ends_with("attn_v.weight") {
                let i = s.layer.expect("layer tensor");
                // E4B: every layer has attn_v, so its rank is the layer.
                if w == WeightType::Q6K
                    || gemtune_engine::synth::mix::use_more_bits(i, cfg.n_layers)
                {
                    GgmlType::Q6K
                } else {
                    base
                }
            } else {
                base
            };
            assert_eq!(*ty, want, "{} {}", w.name(), s.name);
        }
    }
    // tiny: d = 128 and PLE 32 are not whole super-blocks, so Q4_K falls
    // back to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0 (and the tables to Q8_0);
    // its 256-wide FFN rows keep the k-quants.
    let tiny = preset(SynthVariant::Tiny);
    let plan = tensor_plan(&tiny);
    let types = tensor_types(&plan, tiny.n_layers, WeightType::Q4KM);
    let ty = |name: &str| {
        plan.iter()
            .zip(&types)
            .find(|(s, _)| s.name == name)
            .map(|(_, t)| *t)
            .expect(name)
    };
    assert_eq!(ty("token_embd.weight"), GgmlType::Q8_0);
    assert_eq!(ty("per_layer_token_embd.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q5_0);
    assert_eq!(ty("blk.0.proj.weight"), GgmlType::Q5_0);
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q4K);
    // tiny has 6 layers: use_more_bits holds for layers 2 and 5; its 4
    // attn_v tensors (layers 0, 1, 3, 4: full layers are k_eq_v) for ranks
    // 2 and 3, layers 3 and 4, whose Q6_K falls back to Q8_0.
    assert_eq!(ty("blk.2.ffn_down.weight"), GgmlType::Q6K);
    assert_eq!(ty("blk.1.ffn_down.weight"), GgmlType::Q4K);
    assert_eq!(ty("blk.1.attn_v.weight"), GgmlType::Q5_0);
    assert_eq!(ty("blk.3.attn_v.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.4.attn_v.weight"), GgmlType::Q8_0);
    let q5 = tensor_types(&plan, tiny.n_layers, WeightType::Q5KM);
    let i = plan
        .iter()
        .position(|s| s.name == "blk.0.attn_q.weight")
        .expect("attn_q");
    assert_eq!(q5[i], GgmlType::Q5_1);
}

/// 26B-A4B: the router stays F32, the expert gate/up stacks take the base
/// type, and the layer's `ffn_down` and `ffn_down_exps` share the
/// `use_more_bits` rule, whose Q6_K falls back to Q8_0 (rows of 2112 and
/// 704 are not whole super-blocks) and whose base type to Q5_0 / Q5_1.
#[test]
fn mix_rules_of_the_expert_tensors() {
    let cfg = preset(SynthVariant::B26A4b);
    let plan = tensor_plan(&cfg);
    for (w, base, down_base) in [
        (WeightType::Q4KM, GgmlType::Q4K, GgmlType::Q5_0),
        (WeightType::Q5KM, GgmlType::Q5K, GgmlType::Q5_1),
        (WeightType::Q6K, GgmlType::Q6K, GgmlType::Q8_0),
    ] {
        let types = tensor_types(&plan, cfg.n_layers, w);
        for (s, ty) in plan.iter().zip(&types) {
            let Some(i) = s.layer else { continue };
            let more =
                w == WeightType::Q6K || gemtune_engine::synth::mix::use_more_bits(i, cfg.n_layers);
            let want = if s.name.ends_with("ffn_gate_inp.weight") || s.dims.len() == 1 {
                GgmlType::F32
            } else if s.name.ends_with("ffn_down_exps.weight")
                || s.name.ends_with("ffn_down.weight")
            {
                if more {
                    GgmlType::Q8_0
                } else {
                    down_base
                }
            } else if s.name.ends_with("ffn_gate_up_exps.weight") {
                base
            } else {
                continue;
            };
            assert_eq!(*ty, want, "{} {}", w.name(), s.name);
        }
    }
}
