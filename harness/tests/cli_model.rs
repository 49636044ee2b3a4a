//! `gemtune synth` and `gemtune info` through the built binary.

mod common;

use common::text;

use std::path::Path;
use std::process::Output;

fn gemtune(args: &[&str]) -> Output {
    common::gemtune().args(args).output().expect("run gemtune")
}

fn synth_tiny(dir: &Path, wtype: &str) -> String {
    let path = dir.join(format!("tiny-{wtype}.gguf"));
    let p = path.to_str().unwrap().to_string();
    let out = gemtune(&["synth", "tiny", wtype, &p, "--seed", "5"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "synth failed: {}",
        text(&out.stderr)
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("tensors     106"), "{stdout}");
    assert!(stdout.contains("parameters  4276390"), "{stdout}");
    assert!(stdout.contains("seconds"), "{stdout}");
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(stdout.contains(&format!("bytes       {size}")), "{stdout}");
    p
}

#[test]
fn synth_then_info_describes_the_tiny_model() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth_tiny(dir.path(), "q8_0");
    let out = gemtune(&["info", &p]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "info failed: {}",
        text(&out.stderr)
    );
    let s = text(&out.stdout);
    for want in [
        "architecture  gemma4",
        "name          gemma4-tiny-synth",
        "parameters    4.28 M (4276390)",
        "tensors       106",
        "context       512",
        "vocab         2048",
        "layers        6 (4 swa, 2 full), window 8, KV-shared 2",
    ] {
        assert!(s.contains(want), "missing {want:?} in\n{s}");
    }
    // Bytes by type: 1-D tensors F32, matrices and embeddings Q8_0.
    let f32_row = s.lines().find(|l| l.starts_with("f32 ")).expect("f32 row");
    assert_eq!(f32_row.split_whitespace().nth(1), Some("51"));
    let q8_row = s
        .lines()
        .find(|l| l.starts_with("q8_0 "))
        .expect("q8_0 row");
    assert_eq!(q8_row.split_whitespace().nth(1), Some("55"));
    // Per-layer table: index, type, head dim, q heads, kv heads, ffn, donor, k_eq_v, scale.
    let layer = |i: usize| -> Vec<String> {
        s.lines()
            .map(|l| l.split_whitespace().map(str::to_string).collect::<Vec<_>>())
            .find(|c| c.len() == 9 && c[0] == i.to_string())
            .unwrap_or_else(|| panic!("no row for layer {i} in\n{s}"))
    };
    assert_eq!(layer(0)[1..8], ["swa", "256", "4", "2", "256", "-", "no"]);
    assert_eq!(layer(2)[1..8], ["full", "512", "4", "1", "256", "-", "yes"]);
    assert_eq!(layer(4)[1..8], ["swa", "256", "4", "2", "512", "3", "no"]);
    assert_eq!(layer(5)[1..8], ["full", "512", "4", "1", "512", "2", "yes"]);
    for i in 0..6 {
        let scale: f32 = layer(i)[8].parse().unwrap();
        assert!((0.9..=1.0).contains(&scale), "layer {i} scale {scale}");
    }
    // The CUDA engine's planned device bytes next to the file's: a Q8_0
    // file is read as it is under both profiles.
    for profile in ["main  ", "strict"] {
        let line = s
            .lines()
            .find(|l| l.starts_with(&format!("cuda weights  {profile} (sm_90): ")))
            .unwrap_or_else(|| panic!("no {profile} device-weights line in\n{s}"));
        assert!(
            line.ends_with(", 0 lossy conversion(s), 0 exact widening(s)"),
            "{line}"
        );
        let bytes: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert!(
            bytes.len() >= 2 && bytes[0] >= bytes[1] && bytes[1] > 0,
            "{line}"
        );
    }
}

#[test]
fn q4_0_file_stores_embeddings_as_q8_0_when_rows_are_not_256_wide() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth_tiny(dir.path(), "q4_0");
    let s = text(&gemtune(&["info", &p]).stdout);
    let row = |ty: &str| {
        s.lines()
            .find(|l| l.starts_with(&format!("{ty} ")))
            .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
    };
    // d = 128 and L·P = 192 are not multiples of 256: both tables fall back to Q8_0.
    assert_eq!(row("q8_0").as_deref(), Some("2"));
    assert_eq!(row("q4_0").as_deref(), Some("53"));
}

#[test]
fn truncated_file_exits_4_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth_tiny(dir.path(), "f16");
    let bytes = std::fs::read(&p).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 3]).unwrap();
    let out = gemtune(&["info", cut.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4));
    let err = text(&out.stderr);
    assert!(err.contains("cut.gguf"), "{err}");
    assert!(err.starts_with("error: "), "{err}");
}

#[test]
fn bad_inputs_exit_4() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.gguf");
    let out = gemtune(&["info", missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("nope.gguf"));
    let out = gemtune(&[
        "synth",
        "tiny",
        "f32",
        dir.path().join("v.gguf").to_str().unwrap(),
        "--vocab",
        "7",
    ]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stderr).contains("vocab"), "{}", text(&out.stderr));
}
