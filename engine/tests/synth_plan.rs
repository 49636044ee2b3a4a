//! Tensor plans and presets against the published figures (spec §2, §4.2, §7).
//! Everything is counted from the plan: no multi-GB file is written.

use gemtune_engine::config::{AttnKind, Gemma4Config};
use gemtune_engine::plan::{active_parameter_count, parameter_count, tensor_plan, TensorRole};
use gemtune_engine::synth::{preset, tensor_type, SynthVariant, WeightType};
use gemtune_kernels::quant::GgmlType;

fn counts(cfg: &Gemma4Config) -> (usize, usize, u64) {
    let plan = tensor_plan(cfg);
    let one_d = plan.iter().filter(|t| t.dims.len() == 1).count();
    (plan.len(), one_d, parameter_count(cfg))
}

fn elements(cfg: &Gemma4Config, name: &str) -> u64 {
    tensor_plan(cfg)
        .into_iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} not planned"))
        .n_elements()
}

/// Bytes of every planned tensor stored as `w` would store it.
fn file_bytes(cfg: &Gemma4Config, w: WeightType) -> u64 {
    tensor_plan(cfg)
        .iter()
        .map(|t| tensor_type(t, w).row_bytes(t.n_elements()).unwrap())
        .sum()
}

#[test]
fn e2b_has_601_tensors_and_4_647_450_147_parameters() {
    assert_eq!(
        counts(&preset(SynthVariant::E2b)),
        (601, 283, 4_647_450_147)
    );
}

#[test]
fn e4b_has_720_tensors_and_7_518_069_290_parameters() {
    assert_eq!(
        counts(&preset(SynthVariant::E4b)),
        (720, 339, 7_518_069_290)
    );
}

#[test]
fn b12_has_667_tensors_and_11_907_350_576_parameters() {
    assert_eq!(
        counts(&preset(SynthVariant::B12)),
        (667, 338, 11_907_350_576)
    );
}

#[test]
fn b31_has_833_tensors_and_30_697_345_596_parameters() {
    let (n, _, p) = counts(&preset(SynthVariant::B31));
    assert_eq!((n, p), (833, 30_697_345_596));
}

#[test]
fn b26_a4b_has_658_tensors_and_3_82_b_of_25_23_b_parameters_active() {
    let cfg = preset(SynthVariant::B26A4b);
    let (n, _, p) = counts(&cfg);
    assert_eq!((n, p), (658, 25_233_142_046));
    let plan = tensor_plan(&cfg);
    let experts: u64 = plan
        .iter()
        .filter(|t| t.role == TensorRole::Experts)
        .map(|t| t.n_elements())
        .sum();
    assert_eq!(experts, 22_837_985_280);
    assert_eq!(active_parameter_count(&cfg), 3_822_530_846);
    let dims = |name: &str| {
        plan.iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} not planned"))
            .dims
            .clone()
    };
    assert_eq!(dims("blk.0.ffn_gate_inp.weight"), vec![2816, 128]);
    assert_eq!(dims("blk.0.ffn_gate_inp.scale"), vec![2816]);
    assert_eq!(dims("blk.0.ffn_gate_up_exps.weight"), vec![2816, 1408, 128]);
    assert_eq!(dims("blk.0.ffn_down_exps.weight"), vec![704, 2816, 128]);
    assert_eq!(dims("blk.0.ffn_down_exps.scale"), vec![128]);
    assert_eq!(dims("blk.29.ffn_gate.weight"), vec![2816, 2112]);
    assert_eq!(dims("blk.29.ffn_down.weight"), vec![2112, 2816]);
    for norm in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
        assert_eq!(dims(&format!("blk.7.{norm}.weight")), vec![2816]);
    }
    // Full layers (5, 11, ..., 29): 2 KV heads of 512, k_eq_v (no attn_v).
    assert_eq!(dims("blk.5.attn_k.weight"), vec![2816, 1024]);
    assert!(!plan.iter().any(|t| t.name == "blk.5.attn_v.weight"));
    assert_eq!(dims("blk.4.attn_v.weight"), vec![2816, 2048]);
    assert_eq!(dims("blk.0.attn_q.weight"), vec![2816, 4096]);
    assert_eq!(dims("blk.5.attn_q.weight"), vec![2816, 8192]);
    assert_eq!(
        (cfg.sliding_window, cfg.ple_dim, cfg.n_kv_shared_layers),
        (1024, 0, 0)
    );
    // The router stays F32 and the expert stacks take the file's type.
    let ty = |name: &str, w| tensor_type(plan.iter().find(|t| t.name == name).unwrap(), w);
    assert_eq!(
        ty("blk.0.ffn_gate_inp.weight", WeightType::Q8_0),
        GgmlType::F32
    );
    assert_eq!(
        ty("blk.0.ffn_gate_up_exps.weight", WeightType::Q4_0),
        GgmlType::Q4_0
    );
    assert_eq!(
        ty("blk.0.ffn_down_exps.weight", WeightType::Q8_0),
        GgmlType::Q8_0
    );
}

#[test]
fn e4b_embedding_tables_and_q8_0_bytes() {
    let cfg = preset(SynthVariant::E4b);
    assert_eq!(elements(&cfg, "token_embd.weight"), 671_088_640);
    assert_eq!(elements(&cfg, "per_layer_token_embd.weight"), 2_818_572_288);
    assert_eq!(elements(&cfg, "per_layer_model_proj.weight"), 27_525_120);
    assert_eq!(elements(&cfg, "blk.0.attn_q.weight"), 5_242_880);
    assert_eq!(elements(&cfg, "blk.5.attn_q.weight"), 10_485_760);
    assert_eq!(elements(&cfg, "blk.5.attn_k.weight"), 2_621_440);
    assert_eq!(elements(&cfg, "blk.0.ffn_down.weight"), 26_214_400);
    // All matrices Q8_0, embeddings Q8_0, 1-D F32 (spec §7).
    assert_eq!(file_bytes(&cfg, WeightType::Q8_0), 7_989_610_664);
}

#[test]
fn ple_table_sizes_match_the_published_types() {
    let e2b = preset(SynthVariant::E2b);
    let e4b = preset(SynthVariant::E4b);
    let ple = |cfg: &Gemma4Config, w: WeightType| {
        let t = tensor_plan(cfg)
            .into_iter()
            .find(|t| t.name == "per_layer_token_embd.weight")
            .unwrap();
        let ty = tensor_type(&t, w);
        (ty, ty.row_bytes(t.n_elements()).unwrap())
    };
    assert_eq!(ple(&e2b, WeightType::Q4_0), (GgmlType::Q6K, 1_926_758_400));
    assert_eq!(ple(&e4b, WeightType::Q4_0), (GgmlType::Q6K, 2_312_110_080));
    assert_eq!(ple(&e2b, WeightType::Q8_0), (GgmlType::Q8_0, 2_495_610_880));
    assert_eq!(ple(&e4b, WeightType::Q8_0), (GgmlType::Q8_0, 2_994_733_056));
}

#[test]
fn b12_all_q4_0_tensor_data() {
    // The QAT file stores all 329 matrices (token_embd included) as Q4_0.
    let cfg = preset(SynthVariant::B12);
    let plan = tensor_plan(&cfg);
    let matrices = plan.iter().filter(|t| t.dims.len() == 2).count();
    assert_eq!(matrices, 329);
    let bytes: u64 = plan
        .iter()
        .map(|t| {
            let ty = if t.dims.len() == 2 {
                GgmlType::Q4_0
            } else {
                GgmlType::F32
            };
            ty.row_bytes(t.n_elements()).unwrap()
        })
        .sum();
    assert_eq!(bytes, 6_700_531_904);
}

fn donors(cfg: &Gemma4Config) -> Vec<(usize, Option<usize>)> {
    cfg.layers.iter().map(|l| (l.index, l.kv_donor)).collect()
}

#[test]
fn kv_donors_are_the_last_non_shared_layer_of_the_same_kind() {
    let e2b = preset(SynthVariant::E2b);
    assert_eq!(e2b.first_shared_layer(), 15);
    for l in &e2b.layers[15..] {
        let want = if l.kind == AttnKind::Sliding { 13 } else { 14 };
        assert_eq!(l.kv_donor, Some(want), "e2b layer {}", l.index);
        assert_eq!(l.ffn_dim, 12288);
    }
    assert!(e2b.layers[..15]
        .iter()
        .all(|l| l.kv_donor.is_none() && l.ffn_dim == 6144));
    let e4b = preset(SynthVariant::E4b);
    assert_eq!(e4b.first_shared_layer(), 24);
    for l in &e4b.layers[24..] {
        let want = if l.kind == AttnKind::Sliding { 22 } else { 23 };
        assert_eq!(l.kv_donor, Some(want), "e4b layer {}", l.index);
    }
    let tiny = preset(SynthVariant::Tiny);
    assert_eq!(
        donors(&tiny),
        vec![
            (0, None),
            (1, None),
            (2, None),
            (3, None),
            (4, Some(3)),
            (5, Some(2))
        ]
    );
    assert!(donors(&preset(SynthVariant::B31))
        .iter()
        .all(|(_, d)| d.is_none()));
}

#[test]
fn layer_patterns_and_kv_heads() {
    let full = |cfg: &Gemma4Config| -> Vec<usize> {
        cfg.layers
            .iter()
            .filter(|l| l.kind == AttnKind::Full)
            .map(|l| l.index)
            .collect()
    };
    assert_eq!(
        full(&preset(SynthVariant::E2b)),
        vec![4, 9, 14, 19, 24, 29, 34]
    );
    assert_eq!(
        full(&preset(SynthVariant::E4b)),
        vec![5, 11, 17, 23, 29, 35, 41]
    );
    assert_eq!(full(&preset(SynthVariant::B12)).len(), 8);
    assert_eq!(full(&preset(SynthVariant::B31)).last(), Some(&59));
    assert_eq!(full(&preset(SynthVariant::Tiny)), vec![2, 5]);
    let b12 = preset(SynthVariant::B12);
    assert_eq!((b12.layers[0].n_kv_heads, b12.layers[5].n_kv_heads), (8, 1));
    assert!(b12.layers[5].k_eq_v && !b12.layers[0].k_eq_v);
    let b31 = preset(SynthVariant::B31);
    assert_eq!(
        (b31.layers[0].n_kv_heads, b31.layers[5].n_kv_heads),
        (16, 4)
    );
    let tiny = preset(SynthVariant::Tiny);
    let kv: Vec<usize> = tiny.layers.iter().map(|l| l.n_kv_heads).collect();
    assert_eq!(kv, vec![2, 2, 1, 2, 2, 1]);
    let ffn: Vec<usize> = tiny.layers.iter().map(|l| l.ffn_dim).collect();
    assert_eq!(ffn, vec![256, 256, 256, 256, 512, 512]);
    assert!(tiny
        .layers
        .iter()
        .all(|l| l.k_eq_v == (l.kind == AttnKind::Full)));
    assert_eq!(
        (
            tiny.d_model,
            tiny.ple_dim,
            tiny.sliding_window,
            tiny.vocab_size
        ),
        (128, 32, 8, 2048)
    );
}

#[test]
fn shared_layers_list_their_unused_kv_weights() {
    let e2b = preset(SynthVariant::E2b);
    let plan = tensor_plan(&e2b);
    let unused: Vec<&str> = plan
        .iter()
        .filter(|t| !t.used)
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(unused.len(), 20 * 3);
    assert!(unused.contains(&"blk.15.attn_k.weight"));
    assert!(unused.contains(&"blk.34.attn_v.weight"));
    assert!(unused.contains(&"blk.20.attn_k_norm.weight"));
    // tiny: layer 5 is a shared full layer whose donor is k_eq_v -> no attn_v.
    let tiny = tensor_plan(&preset(SynthVariant::Tiny));
    let names: Vec<&str> = tiny.iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"blk.4.attn_v.weight"));
    assert!(!names.contains(&"blk.5.attn_v.weight"));
    assert!(!names.contains(&"blk.2.attn_v.weight"));
    assert!(names.contains(&"blk.5.attn_k.weight"));
}

#[test]
fn rope_freqs_are_the_converter_factors() {
    let cfg = preset(SynthVariant::E4b);
    let ff = cfg.rope_full.freq_factors.as_ref().unwrap();
    assert_eq!(ff.len(), 256);
    assert!(ff[..64].iter().all(|&x| x == 1.0));
    assert!(ff[64..].iter().all(|&x| x == 1e30));
    let t = tensor_plan(&cfg)
        .into_iter()
        .find(|t| t.name == "rope_freqs.weight")
        .unwrap();
    assert_eq!((t.dims.clone(), t.role), (vec![256], TensorRole::RopeFreqs));
    assert_eq!((cfg.rope_full.dims, cfg.rope_swa.dims), (512, 256));
    assert_eq!(
        (cfg.rope_full.freq_base, cfg.rope_swa.freq_base),
        (1e6, 1e4)
    );
}
