//! `Gemma4Config::from_gguf` on synthetic files: the resolved config equals
//! the preset it was written from, and every kind of bad file gives an
//! error naming the file and the item. Bad files are built with GgufWriter.

use gemtune_engine::config::{AttnKind, ConfigErrorKind, Gemma4Config};
use gemtune_engine::gguf::{GgufFile, GgufValue, GgufValueType, GgufWriter};
use gemtune_engine::synth::{
    builtin_tiny, synth_config, synth_to_vec, SynthModel, SynthOptions, SynthVariant, WeightType,
};
use gemtune_kernels::quant::GgmlType;

const LABEL: &str = "edited-tiny.gguf";

type Tensors = Vec<(String, Vec<u64>, GgmlType)>;

/// tiny (F32) with its metadata and tensor list edited before writing.
fn edited(edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Tensors)) -> GgufFile {
    let model = SynthModel::new(
        SynthVariant::Tiny,
        WeightType::F32,
        &SynthOptions::default(),
    )
    .expect("tiny synth");
    let mut meta = model.writer.metadata().to_vec();
    let mut tensors: Tensors = model
        .writer
        .tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.ty))
        .collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    for (name, dims, ty) in tensors {
        w.add_tensor(name, dims, ty).expect("add tensor");
    }
    let bytes = w.write_to_vec(model.filler()).expect("write");
    GgufFile::from_bytes(bytes, LABEL).expect("valid gguf")
}

fn set(meta: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
    let slot = meta
        .iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("{key}"));
    slot.1 = v;
}

fn remove_tensor(t: &mut Tensors, name: &str) {
    let before = t.len();
    t.retain(|(n, _, _)| n != name);
    assert_eq!(t.len(), before - 1, "{name} not in tiny");
}

fn err_of(f: &GgufFile) -> gemtune_engine::config::ConfigError {
    match Gemma4Config::from_gguf(f) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

#[test]
fn tiny_round_trips_for_every_weight_type() {
    for w in WeightType::ALL {
        let bytes = synth_to_vec(SynthVariant::Tiny, w, SynthOptions::default()).unwrap();
        let f = GgufFile::from_bytes(bytes, "tiny.gguf").unwrap();
        let cfg = Gemma4Config::from_gguf(&f).unwrap();
        assert_eq!(
            cfg,
            synth_config(SynthVariant::Tiny, &SynthOptions::default()),
            "{w:?}"
        );
    }
}

#[test]
fn builtin_tiny_resolves_with_donors_and_k_eq_v() {
    let f = builtin_tiny().unwrap();
    assert_eq!(f.path().to_str(), Some("builtin:tiny"));
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    let donors: Vec<Option<usize>> = cfg.layers.iter().map(|l| l.kv_donor).collect();
    assert_eq!(donors, vec![None, None, None, None, Some(3), Some(2)]);
    let k_eq_v: Vec<bool> = cfg.layers.iter().map(|l| l.k_eq_v).collect();
    assert_eq!(k_eq_v, vec![false, false, true, false, false, true]);
    let hd: Vec<usize> = cfg.layers.iter().map(|l| l.head_dim).collect();
    assert_eq!(hd, vec![256, 256, 512, 256, 256, 512]);
    assert_eq!(cfg.final_logit_softcap, Some(30.0));
    assert_eq!(cfg.rms_eps, 1e-6);
    assert!(cfg.layers.iter().all(|l| l.has_layer_scale));
    let ff = cfg.rope_full.freq_factors.as_ref().unwrap();
    assert_eq!(ff.len(), 256);
    assert_eq!((ff[63], ff[64]), (1.0, 1e30));
}

#[test]
fn vocab_override_is_read_back() {
    let opts = SynthOptions {
        vocab: Some(1500),
        seed: 3,
    };
    let bytes = synth_to_vec(SynthVariant::Tiny, WeightType::Q4_0, opts).unwrap();
    let f = GgufFile::from_bytes(bytes, "v.gguf").unwrap();
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.vocab_size, 1500);
    assert_eq!(f.tensor("token_embd.weight").unwrap().dims, vec![128, 1500]);
}

#[test]
fn too_small_vocab_is_an_error() {
    let opts = SynthOptions {
        vocab: Some(10),
        seed: 0,
    };
    assert!(synth_to_vec(SynthVariant::Tiny, WeightType::F32, opts).is_err());
}

#[test]
fn shared_layers_may_omit_their_unused_kv() {
    let f = edited(|_, t| {
        for name in [
            "blk.4.attn_k.weight",
            "blk.4.attn_v.weight",
            "blk.4.attn_k_norm.weight",
            "blk.5.attn_k.weight",
            "blk.5.attn_k_norm.weight",
        ] {
            remove_tensor(t, name);
        }
    });
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(
        cfg,
        synth_config(SynthVariant::Tiny, &SynthOptions::default())
    );
}

#[test]
fn shared_layer_may_carry_an_unused_v_even_when_its_donor_is_k_eq_v() {
    let f = edited(|_, t| t.push(("blk.5.attn_v.weight".into(), vec![128, 512], GgmlType::F32)));
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.layers[5].kv_donor, Some(2));
    assert!(cfg.layers[5].k_eq_v);
}

#[test]
fn k_eq_v_follows_the_presence_of_attn_v() {
    // Give full layer 2 a V projection: it is no longer k_eq_v, and its
    // consumer (layer 5) follows the donor.
    let f = edited(|_, t| t.push(("blk.2.attn_v.weight".into(), vec![128, 512], GgmlType::F32)));
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    let k_eq_v: Vec<bool> = cfg.layers.iter().map(|l| l.k_eq_v).collect();
    assert_eq!(k_eq_v, vec![false, false, false, false, false, false]);
    // And removing SWA layer 0's V makes it k_eq_v.
    let f = edited(|_, t| remove_tensor(t, "blk.0.attn_v.weight"));
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert!(cfg.layers[0].k_eq_v && !cfg.layers[1].k_eq_v);
}

#[test]
fn donors_follow_the_layer_pattern_not_a_fixed_formula() {
    // Pattern [S,F,S,S,S,F] with 2 shared layers: layer 4 (SWA) reads 3,
    // layer 5 (full) reads 1 (llama.cpp's formula would give 3 and 2... wrong kinds).
    let f = edited(|m, t| {
        set(
            m,
            "gemma4.attention.sliding_window_pattern",
            GgufValue::array(GgufValueType::Bool, [true, false, true, true, true, false]),
        );
        set(
            m,
            "gemma4.attention.head_count_kv",
            GgufValue::array(GgufValueType::U32, [2u32, 1, 2, 2, 2, 1]),
        );
        // Re-shape layers 1 and 2 for their new kinds.
        for (name, dims, _) in t.iter_mut() {
            let new = match name.as_str() {
                "blk.1.attn_q.weight" => Some(vec![128, 2048]),
                "blk.1.attn_output.weight" => Some(vec![2048, 128]),
                "blk.1.attn_k.weight" => Some(vec![128, 512]),
                "blk.1.attn_v.weight" => Some(vec![128, 512]),
                "blk.1.attn_q_norm.weight" | "blk.1.attn_k_norm.weight" => Some(vec![512]),
                "blk.2.attn_q.weight" => Some(vec![128, 1024]),
                "blk.2.attn_output.weight" => Some(vec![1024, 128]),
                "blk.2.attn_k.weight" => Some(vec![128, 512]),
                "blk.2.attn_q_norm.weight" | "blk.2.attn_k_norm.weight" => Some(vec![256]),
                _ => None,
            };
            if let Some(d) = new {
                *dims = d;
            }
        }
        t.push(("blk.2.attn_v.weight".into(), vec![128, 512], GgmlType::F32));
    });
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.layers[1].kind, AttnKind::Full);
    assert_eq!(cfg.layers[4].kv_donor, Some(3));
    assert_eq!(cfg.layers[5].kv_donor, Some(1));
}

#[test]
fn missing_key_names_file_and_key() {
    let f = edited(|m, _| m.retain(|(k, _)| k != "gemma4.block_count"));
    let e = err_of(&f);
    assert_eq!(e.kind, ConfigErrorKind::MissingKey);
    assert_eq!(
        e.to_string(),
        "edited-tiny.gguf: key 'gemma4.block_count': missing required key"
    );
}

#[test]
fn mistyped_key_names_expected_and_found_types() {
    let f = edited(|m, _| set(m, "gemma4.block_count", GgufValue::String("six".into())));
    let e = err_of(&f);
    assert_eq!(
        e.to_string(),
        "edited-tiny.gguf: key 'gemma4.block_count': expected an unsigned integer, found string"
    );
    let f = edited(|m, _| {
        set(
            m,
            "gemma4.attention.layer_norm_rms_epsilon",
            GgufValue::U32(1),
        )
    });
    let e = err_of(&f);
    assert_eq!(e.item, "key 'gemma4.attention.layer_norm_rms_epsilon'");
    assert!(
        matches!(
            e.kind,
            ConfigErrorKind::WrongType {
                expected: "a float",
                ..
            }
        ),
        "{e}"
    );
    let f = edited(|m, _| set(m, "gemma4.embedding_length", GgufValue::I32(-128)));
    assert!(err_of(&f)
        .to_string()
        .ends_with("expected an unsigned integer, found i32 -128"));
}

#[test]
fn per_layer_arrays_of_the_wrong_length() {
    let f = edited(|m, _| {
        set(
            m,
            "gemma4.attention.sliding_window_pattern",
            GgufValue::array(GgufValueType::Bool, [true, true, false, true, true]),
        )
    });
    let e = err_of(&f);
    assert_eq!(e.item, "key 'gemma4.attention.sliding_window_pattern'");
    assert_eq!(
        e.kind,
        ConfigErrorKind::WrongLength {
            expected: 6,
            found: 5
        }
    );
    let f = edited(|m, _| {
        set(
            m,
            "gemma4.attention.head_count_kv",
            GgufValue::array(GgufValueType::U32, [2u32, 2, 1, 2, 2, 1, 1]),
        )
    });
    assert_eq!(
        err_of(&f).kind,
        ConfigErrorKind::WrongLength {
            expected: 6,
            found: 7
        }
    );
    let f = edited(|m, _| {
        set(
            m,
            "gemma4.feed_forward_length",
            GgufValue::array(GgufValueType::U32, [256u32, 256]),
        )
    });
    assert_eq!(err_of(&f).item, "key 'gemma4.feed_forward_length'");
}

#[test]
fn wrong_tensor_shape_names_tensor_expected_and_found() {
    let f = edited(|_, t| {
        let q = t.iter_mut().find(|x| x.0 == "blk.1.attn_q.weight").unwrap();
        q.1 = vec![128, 512];
    });
    let e = err_of(&f);
    assert_eq!(e.item, "tensor 'blk.1.attn_q.weight'");
    assert_eq!(
        e.kind,
        ConfigErrorKind::TensorShape {
            expected: vec![128, 1024],
            found: vec![128, 512]
        }
    );
    assert!(e
        .to_string()
        .starts_with("edited-tiny.gguf: tensor 'blk.1.attn_q.weight': shape [128, 512]"));
}

#[test]
fn missing_tensor_is_named() {
    let f = edited(|_, t| remove_tensor(t, "blk.3.ffn_up.weight"));
    let e = err_of(&f);
    assert_eq!(e.kind, ConfigErrorKind::MissingTensor);
    assert_eq!(
        e.to_string(),
        "edited-tiny.gguf: tensor 'blk.3.ffn_up.weight': missing tensor"
    );
    // An owning layer without K at all is missing attn_k.
    let f = edited(|_, t| remove_tensor(t, "blk.3.attn_k.weight"));
    assert_eq!(err_of(&f).item, "tensor 'blk.3.attn_k.weight'");
}

#[test]
fn unexpected_tensors_are_named() {
    let f = edited(|_, t| {
        t.push(("output.weight".into(), vec![128, 2048], GgmlType::F32));
        t.push(("blk.0.mystery.weight".into(), vec![32], GgmlType::F32));
    });
    let e = err_of(&f);
    assert_eq!(
        e.kind,
        ConfigErrorKind::UnexpectedTensors(vec![
            "output.weight".into(),
            "blk.0.mystery.weight".into()
        ])
    );
    assert!(
        e.to_string()
            .contains("output.weight, blk.0.mystery.weight"),
        "{e}"
    );
}

#[test]
fn other_architecture_is_refused() {
    let f = edited(|m, _| set(m, "general.architecture", GgufValue::String("llama".into())));
    let e = err_of(&f);
    assert_eq!(e.kind, ConfigErrorKind::WrongArchitecture("llama".into()));
    assert_eq!(
        e.to_string(),
        "edited-tiny.gguf: key 'general.architecture': architecture is 'llama', expected 'gemma4'"
    );
}

#[test]
fn shared_layer_without_a_donor_of_its_kind() {
    // Only layer 5 is full, and it is shared: no full layer owns KV.
    let f = edited(|m, _| {
        set(
            m,
            "gemma4.attention.sliding_window_pattern",
            GgufValue::array(GgufValueType::Bool, [true, true, true, true, true, false]),
        )
    });
    let e = err_of(&f);
    assert_eq!(e.item, "layer 5");
    assert_eq!(
        e.kind,
        ConfigErrorKind::NoDonor {
            layer: 5,
            kind: "full"
        }
    );
}

#[test]
fn mismatched_key_and_value_lengths() {
    let f = edited(|m, _| set(m, "gemma4.attention.value_length_swa", GgufValue::U32(128)));
    let e = err_of(&f);
    assert_eq!(e.item, "key 'gemma4.attention.value_length_swa'");
    assert!(matches!(e.kind, ConfigErrorKind::InvalidValue(_)));
}

#[test]
fn softcap_defaults_to_30_and_eps_is_read() {
    let f = edited(|m, _| m.retain(|(k, _)| k != "gemma4.final_logit_softcapping"));
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(cfg.final_logit_softcap, Some(30.0));
}

#[test]
fn rope_freqs_of_the_wrong_length() {
    let f = edited(|_, t| {
        let r = t.iter_mut().find(|x| x.0 == "rope_freqs.weight").unwrap();
        r.1 = vec![128];
    });
    let e = err_of(&f);
    assert_eq!(e.item, "tensor 'rope_freqs.weight'");
    assert_eq!(
        e.kind,
        ConfigErrorKind::TensorShape {
            expected: vec![256],
            found: vec![128]
        }
    );
}
