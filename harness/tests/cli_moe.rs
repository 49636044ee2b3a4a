//! The mixture-of-experts model through the built binary: `synth tiny-moe`,
//! `info` with the active parameters per token and the CUDA engine's
//! planned device bytes, `run` on the CPU engine,
//! and malformed expert tensors or keys refused with exit 4 and a message
//! naming the file and the item (no panic).

mod common;

use common::{log, text};

use gemtune_engine::gguf::{GgufFile, GgufValue, GgufWriter};
use std::path::{Path, PathBuf};
use std::process::Output;

fn gemtune(args: &[&str]) -> Output {
    common::gemtune().args(args).output().expect("run gemtune")
}

fn synth_tiny_moe(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-moe.gguf");
    let out = gemtune(&["synth", "tiny-moe", "q8_0", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", log(&out));
    path
}

/// A copy of `src` with its metadata edited by `meta` and each tensor's
/// dims by `dims` (data copied where the size is unchanged, else zeros;
/// `None` drops the tensor).
fn edited(
    src: &Path,
    out: &Path,
    meta: impl Fn(&mut Vec<(String, GgufValue)>),
    dims: impl Fn(&str, &[u64]) -> Option<Vec<u64>>,
) {
    let f = GgufFile::open(src).unwrap();
    let mut md = f.metadata().to_vec();
    meta(&mut md);
    let mut w = GgufWriter::new();
    for (k, v) in md {
        w.add_metadata(k, v);
    }
    for t in f.tensors() {
        if let Some(d) = dims(&t.name, &t.dims) {
            w.add_tensor(t.name.clone(), d, t.ty).unwrap();
        }
    }
    w.write_with(out, |_, info, dst: &mut [u8]| -> Result<(), String> {
        match f.tensor(&info.name) {
            Some(t) if f.tensor_data(t).len() == dst.len() => dst.copy_from_slice(f.tensor_data(t)),
            _ => dst.fill(0),
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn synth_info_and_cpu_run_of_tiny_moe() {
    let dir = tempfile::tempdir().unwrap();
    let p = synth_tiny_moe(dir.path());
    let ps = p.to_str().unwrap();
    let out = gemtune(&["info", ps]);
    assert_eq!(out.status.code(), Some(0), "{}", log(&out));
    let s = text(&out.stdout);
    // Per layer: 2 of the 6 experts' gate_up (128 x 192) and down
    // (96 x 128) stacks count as active.
    let f = GgufFile::open(&p).unwrap();
    let total: u64 = f.tensors().iter().map(|t| t.n_elements()).sum();
    let experts_per_layer = 6 * (128 * 192 + 96 * 128);
    let active = total - 6 * experts_per_layer + 6 * experts_per_layer * 2 / 6;
    let line = s
        .lines()
        .find(|l| l.starts_with("active "))
        .unwrap_or_else(|| panic!("no active line in\n{s}"));
    assert!(
        line.contains(&format!("({active}) per token")),
        "{line}\n(want {active})"
    );
    assert!(line.ends_with("2 of 6 experts, expert FFN 96"), "{line}");
    // The CUDA engine plans the expert block: every expert stack and the
    // router counted on the device, nothing converted (Q8_0 experts, F32
    // router, both read as stored).
    for profile in ["main  ", "strict"] {
        let line = s
            .lines()
            .find(|l| l.starts_with(&format!("cuda weights  {profile} (sm_90): ")))
            .unwrap_or_else(|| panic!("no cuda weights line for {profile} in\n{s}"));
        assert!(
            line.ends_with(", 0 lossy conversion(s), 0 exact widening(s)"),
            "{line}"
        );
    }
    assert!(!s.contains("cannot plan"), "{s}");

    let out = gemtune(&["run", "-m", ps, "-p", "hi", "-n", "4", "--backend", "cpu"]);
    assert_eq!(out.status.code(), Some(0), "{}", log(&out));
}

/// tiny-moe's d_model of 128 is not whole k-quant super-blocks, so its
/// q4_k_m mix falls back to Q5_0 and Q8_0 (as llama.cpp's quantizer does
/// for the 26B-A4B expert and shared down projections). No kernel reads
/// Q5_0, and the CUDA engine reads those matrices as Q8_0 widened exactly:
/// `info` counts no lossy conversion under either profile, names every
/// widened matrix, and `strict` (which refuses lossy conversions) plans it.
#[test]
fn q5_0_fallbacks_are_widened_exactly_not_converted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny-moe-q4km.gguf");
    let ps = path.to_str().unwrap();
    let out = gemtune(&["synth", "tiny-moe", "q4_k_m", ps]);
    assert_eq!(out.status.code(), Some(0), "{}", log(&out));
    let out = gemtune(&["info", ps]);
    assert_eq!(out.status.code(), Some(0), "{}", log(&out));
    let s = text(&out.stdout);
    for profile in ["main  ", "strict"] {
        let line = s
            .lines()
            .find(|l| l.starts_with(&format!("cuda weights  {profile} (sm_90): ")))
            .unwrap_or_else(|| panic!("no cuda weights line for {profile} in\n{s}"));
        let widened: usize = line
            .strip_suffix(" exact widening(s)")
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no widening count in {line}"));
        assert!(line.contains(", 0 lossy conversion(s), "), "{line}");
        assert!(widened > 0, "{line}");
    }
    let widened: Vec<&str> = s
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("widened: "))
        .collect();
    assert!(
        widened
            .iter()
            .any(|l| l.contains("ffn_down_exps.weight (q5_0) -> q8_0 planes, exact")),
        "{s}"
    );
    assert!(!s.contains("converted: "), "{s}");
    assert!(!s.contains("cannot plan"), "{s}");
}

fn assert_refused(args: &[&str], what: &[&str]) {
    let out = gemtune(args);
    assert_eq!(out.status.code(), Some(4), "{}", log(&out));
    let err = text(&out.stderr);
    assert!(err.starts_with("error: "), "{}", log(&out));
    assert!(!err.contains("panicked"), "{}", log(&out));
    for w in what {
        assert!(err.contains(w), "missing {w:?}: {}", log(&out));
    }
}

#[test]
fn malformed_moe_files_exit_4_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth_tiny_moe(dir.path());
    let keep = |_: &str, d: &[u64]| Some(d.to_vec());

    let used = dir.path().join("used.gguf");
    edited(
        &src,
        &used,
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "gemma4.expert_used_count" {
                    *v = GgufValue::U32(9);
                }
            }
        },
        keep,
    );
    let shape = dir.path().join("shape.gguf");
    edited(
        &src,
        &shape,
        |_| {},
        |n, d| {
            Some(if n == "blk.1.ffn_down_exps.weight" {
                vec![d[0], d[1], d[2] - 1]
            } else {
                d.to_vec()
            })
        },
    );
    let scale = dir.path().join("scale.gguf");
    edited(
        &src,
        &scale,
        |_| {},
        |n, d| (n != "blk.4.ffn_down_exps.scale").then(|| d.to_vec()),
    );
    let cases: [(&PathBuf, &[&str]); 3] = [
        (
            &used,
            &[
                "used.gguf",
                "gemma4.expert_used_count",
                "9 experts used per token, but the model has 6",
            ],
        ),
        (
            &shape,
            &["shape.gguf", "blk.1.ffn_down_exps.weight", "[96, 128, 5]"],
        ),
        (
            &scale,
            &["scale.gguf", "blk.4.ffn_down_exps.scale", "missing tensor"],
        ),
    ];
    for (path, what) in cases {
        let p = path.to_str().unwrap();
        assert_refused(&["info", p], what);
        assert_refused(&["run", "-m", p, "-p", "hi", "--backend", "cpu"], what);
    }
}
