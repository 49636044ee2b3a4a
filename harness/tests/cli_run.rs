//! `gemtune run`, `gemtune logits` and `gemtune demo --cpu` end to end on the
//! built-in demo model (the tiny preset with trained weights).

mod common;

use common::text;

use std::process::Output;

fn gemtune(args: &[&str]) -> Output {
    common::gemtune()
        .args(args)
        .output()
        .expect("spawn gemtune")
}

/// The one stats line: `prefill: N tok, X tok/s | decode: M tok, Y tok/s`.
fn stats(stderr: &str) -> (usize, usize) {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("prefill: "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one stats line expected in:\n{stderr}"
    );
    let f: Vec<&str> = lines[0].split_whitespace().collect();
    // prefill: N tok, X tok/s | decode: M tok, Y tok/s
    assert_eq!(f.len(), 11, "stats line shape: {}", lines[0]);
    assert_eq!(
        (f[0], f[2], f[4], f[5], f[6], f[8], f[10]),
        ("prefill:", "tok,", "tok/s", "|", "decode:", "tok,", "tok/s")
    );
    for r in [f[3], f[9]] {
        let v: f64 = r.parse().expect("rate is a number");
        assert!(v.is_finite() && v >= 0.0);
    }
    (f[1].parse().unwrap(), f[7].parse().unwrap())
}

#[test]
fn run_builtin_model_prints_one_stats_line() {
    let o = gemtune(&["run", "-p", "hello", "-n", "8"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (prefill, decode) = stats(&text(&o.stderr));
    // Chat template around "hello": more than BOS + one word.
    assert!(prefill > 5, "prefill {prefill}");
    assert!(decode <= 7, "at most n-1 single-token passes, got {decode}");
    assert!(!text(&o.stdout).trim_end_matches('\n').contains("prefill:"));
}

#[test]
fn raw_prompt_is_bos_plus_text_and_greedy_is_repeatable() {
    let a = gemtune(&["run", "-p", "hello", "-n", "6", "--raw"]);
    let b = gemtune(&["run", "-p", "hello", "-n", "6", "--raw"]);
    assert!(a.status.success(), "{}", text(&a.stderr));
    let (prefill, _) = stats(&text(&a.stderr));
    let chat = gemtune(&["run", "-p", "hello", "-n", "1"]);
    let (chat_prefill, _) = stats(&text(&chat.stderr));
    assert!(
        prefill < chat_prefill,
        "raw {prefill} vs chat {chat_prefill}"
    );
    assert_eq!(a.stdout, b.stdout, "greedy output must not vary");
}

#[test]
fn seeded_sampling_is_repeatable() {
    let args = [
        "run", "-p", "hi there", "-n", "10", "--temp", "0.9", "--top-k", "40", "--seed", "7",
    ];
    let a = gemtune(&args);
    let b = gemtune(&args);
    assert!(a.status.success(), "{}", text(&a.stderr));
    assert_eq!(a.stdout, b.stdout);
}

#[test]
fn bad_input_exits_4_with_a_message() {
    for (args, msg) in [
        (&["run", "-p", ""][..], "prompt is empty"),
        (
            &["run", "-p", "x", "-m", "/nonexistent/model.gguf"][..],
            "/nonexistent/model.gguf",
        ),
        (
            &["logits", "--tokens", "2,999999", "--out", "/dev/null"][..],
            "out of range",
        ),
        (
            &["logits", "--tokens", "", "--out", "/dev/null"][..],
            "no token ids",
        ),
        (
            &["logits", "--tokens", "2,x", "--out", "/dev/null"][..],
            "not a token id",
        ),
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(msg),
            "{args:?}: {}",
            text(&o.stderr)
        );
    }
}

#[test]
fn inputs_longer_than_the_context_exit_4() {
    // tiny's context is 512 positions.
    let long = "hello world ".repeat(400);
    let o = gemtune(&["run", "-p", &long, "--raw", "-n", "1"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("context holds 512"),
        "{}",
        text(&o.stderr)
    );
    let ids = vec!["5"; 513].join(",");
    let o = gemtune(&["logits", "--tokens", &ids, "--out", "/dev/null"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("exceed the model's context of 512"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn logits_writes_last_or_all_rows() {
    let dir = tempfile::tempdir().unwrap();
    let last = dir.path().join("last.bin");
    let all = dir.path().join("all.bin");
    let o = gemtune(&[
        "logits",
        "--tokens",
        "2,105,7,9",
        "--out",
        last.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = gemtune(&[
        "logits",
        "--tokens",
        "2 105 7 9",
        "--all",
        "--out",
        all.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let f32s = |p: &std::path::Path| -> Vec<f32> {
        std::fs::read(p)
            .unwrap()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let (l, a) = (f32s(&last), f32s(&all));
    let vocab = l.len();
    assert_eq!(vocab, 2048, "tiny vocab");
    assert_eq!(a.len(), 4 * vocab);
    assert!(a.iter().all(|v| v.is_finite() && v.abs() <= 30.0));
    let tail = &a[3 * vocab..];
    let diff = l
        .iter()
        .zip(tail)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(diff < 1e-3, "last row of --all vs last-only: {diff}");
}

#[test]
fn another_architecture_is_refused_with_exit_4() {
    use gemtune_engine::gguf::{GgufValue, GgufWriter};
    let src = gemtune_engine::synth::builtin_tiny().unwrap();
    let mut w = GgufWriter::from_file(&src);
    w.add_metadata("general.architecture", GgufValue::String("llama".into()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("llama.gguf");
    w.write_with(&path, |i, _, dst: &mut [u8]| {
        dst.copy_from_slice(src.tensor_data(&src.tensors()[i]));
        Ok::<(), String>(())
    })
    .unwrap();
    let o = gemtune(&["run", "-m", path.to_str().unwrap(), "-p", "hi"]);
    assert_eq!(o.status.code(), Some(4));
    assert!(text(&o.stderr).contains("'llama'"), "{}", text(&o.stderr));
}

#[test]
fn cuda_backend_runs_on_a_gpu_and_exits_4_without_one() {
    let o = gemtune(&["run", "-p", "hi", "-n", "2", "--backend", "cuda"]);
    if gemtune_kernels::gpu::Gpu::new(0).is_ok() {
        assert!(o.status.success(), "{}", text(&o.stderr));
        stats(&text(&o.stderr));
    } else {
        assert_eq!(o.status.code(), Some(4), "{}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains("no CUDA GPU"),
            "{}",
            text(&o.stderr)
        );
    }
}

#[test]
fn run_without_a_model_prints_words() {
    let o = gemtune(&["run", "-p", "Hello", "-n", "24", "--backend", "cpu"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(!out.contains('<'), "a special token in {out:?}");
    let words = out
        .split_whitespace()
        .filter(|w| w.chars().filter(|c| c.is_alphabetic()).count() >= 2)
        .count();
    assert!(words >= 8, "{out:?}");
}

#[test]
fn demo_without_a_gpu_reports_compiles_per_family_and_generates() {
    // A short compile budget: the test is about the command's shape (every
    // family listed, the engine run, exit 0), not the compile time.
    let o = gemtune(&["demo", "--cpu", "--budget-s", "3", "-n", "12"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(out.starts_with("family "), "{out}");
    for f in gemtune_kernels::family::families() {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{} ", f.name()))),
            "{} missing from:\n{out}",
            f.name()
        );
    }
    assert!(err.contains("== 1/2 compile report"), "{err}");
    assert!(err.contains("== 2/2 the CPU engine"), "{err}");
    assert!(err.contains("built-in demo model"), "{err}");
    stats(&err);
}
