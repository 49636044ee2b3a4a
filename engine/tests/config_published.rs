//! Configs resolved from full-size E2B / E4B synthetic files. Only the 1-D
//! tensors are filled; the big matrices stay as holes of a sparse file, so
//! the test writes a few MB while the files have their real 3-8 GB layout.

use gemtune_engine::config::{AttnKind, Gemma4Config};
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::synth::{synth_config, SynthModel, SynthOptions, SynthVariant, WeightType};

fn sparse_file(v: SynthVariant, w: WeightType, dir: &std::path::Path) -> GgufFile {
    let opts = SynthOptions::default();
    let model = SynthModel::new(v, w, &opts).unwrap();
    let path = dir.join(format!("{}.gguf", v.name()));
    let fill = model.filler();
    model
        .writer
        .clone()
        .write_with(&path, |i, info, dst| {
            if info.dims.len() == 1 {
                fill(i, info, dst)
            } else {
                Ok(())
            }
        })
        .unwrap();
    GgufFile::open(&path).unwrap()
}

#[test]
fn e2b_config_from_a_full_size_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = sparse_file(SynthVariant::E2b, WeightType::Q4_0, dir.path());
    assert_eq!(f.tensors().len(), 601);
    let params: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    assert_eq!(params, 4_647_450_147);
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(
        cfg,
        synth_config(SynthVariant::E2b, &SynthOptions::default())
    );
    for l in &cfg.layers[15..] {
        let donor = if l.kind == AttnKind::Sliding { 13 } else { 14 };
        assert_eq!(
            (l.kv_donor, l.ffn_dim),
            (Some(donor), 12288),
            "layer {}",
            l.index
        );
    }
    assert!(cfg.layers.iter().all(|l| !l.k_eq_v && l.n_kv_heads == 1));
    assert_eq!(
        (cfg.vocab_size, cfg.ple_dim, cfg.sliding_window),
        (262_144, 256, 512)
    );
}

#[test]
fn e4b_config_from_a_full_size_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = sparse_file(SynthVariant::E4b, WeightType::Q8_0, dir.path());
    assert_eq!(f.tensors().len(), 720);
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    assert_eq!(
        cfg,
        synth_config(SynthVariant::E4b, &SynthOptions::default())
    );
    for l in &cfg.layers[24..] {
        let donor = if l.kind == AttnKind::Sliding { 22 } else { 23 };
        assert_eq!(l.kv_donor, Some(donor), "layer {}", l.index);
    }
    assert_eq!(cfg.context_length, 131_072);
}
