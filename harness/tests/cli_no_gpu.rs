//! What a machine without a GPU gets (the CI machine's own state; on a GPU
//! host `CUDA_VISIBLE_DEVICES=""` hides the devices, so these hold there
//! too):
//! - the commands whose purpose is GPU kernels or the CUDA engine (`ab`,
//!   `tune`, `bench` without `-m`, `--backend cuda`) stop with one line and
//!   exit 4 before they write anything; `--backend cpu` stays a choice
//!   where it means something;
//! - profiles, tuned tables and `--device` are read and checked on the CPU
//!   backend as on the CUDA one: every error exits 4 naming the file and
//!   line.

mod common;

use common::{log, text};

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `gemtune` with no visible GPU, its scratch and cache directories in
/// `home` (so whatever it writes is found there).
fn no_gpu(home: &Path) -> Command {
    let mut c = common::gemtune();
    c.env("CUDA_VISIBLE_DEVICES", "")
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("HOME", home);
    c
}

/// A scratch checkout: `variants/` with the committed profiles.
fn lab() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let prof = d.path().join("variants/profiles");
    std::fs::create_dir_all(&prof).unwrap();
    std::fs::create_dir_all(d.path().join("variants/shapes")).unwrap();
    for e in std::fs::read_dir(common::repo_root().join("variants/profiles")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            std::fs::copy(&p, prof.join(p.file_name().unwrap())).unwrap();
        }
    }
    d
}

/// Every file under `dir` (relative), for "nothing was written".
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Exit 4 with exactly one line on stderr, which holds every `needle`.
fn one_line_exit_4(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(4), "{}", log(o));
    let err = text(&o.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {}", log(o));
    for n in needles {
        assert!(lines[0].contains(n), "`{n}` missing: {}", log(o));
    }
}

fn synth_tiny(dir: &Path) -> String {
    let p = dir.join("tiny.gguf");
    let o = common::gemtune()
        .args(["synth", "tiny", "q8_0"])
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    p.to_string_lossy().into_owned()
}

#[test]
fn gpu_commands_stop_with_one_line_before_writing_anything() {
    let d = lab();
    let root = d.path();
    let before = files(root);
    let started = std::time::Instant::now();
    let run = |args: &[&str]| no_gpu(root).current_dir(root).args(args).output().unwrap();
    // The issue's case: two profiles without a GPU.
    let o = run(&["ab", "--baseline", "main", "--candidate", "flash-swa"]);
    one_line_exit_4(&o, &["ab measures the CUDA engine", "no CUDA GPU"]);
    // Profiles compared on the CPU run one computation twice.
    let o = run(&[
        "ab",
        "--baseline",
        "main",
        "--candidate",
        "flash-swa",
        "--backend",
        "cpu",
    ]);
    one_line_exit_4(&o, &["--backend cpu", "same computation"]);
    // On the CPU, arms that can differ need a model to run.
    let o = run(&[
        "ab",
        "--baseline",
        "git:HEAD~1",
        "--candidate",
        "main",
        "--backend",
        "cpu",
    ]);
    one_line_exit_4(&o, &["--backend cpu needs -m"]);
    // bench's synthetic E4B is for the GPU, whatever the backend.
    for backend in ["auto", "cuda", "cpu"] {
        let o = run(&["bench", "--backend", backend]);
        one_line_exit_4(&o, &["bench without -m", "no CUDA GPU", "--backend cpu -m"]);
    }
    let o = run(&[
        "tune",
        "softcap",
        "--variants-dir",
        common::repo_root().join("variants").to_str().unwrap(),
    ]);
    if gemtune_kernels::compile::nvrtc_available() {
        one_line_exit_4(&o, &["no CUDA GPU"]);
    } else {
        // NVRTC is checked first: one line about it instead.
        one_line_exit_4(&o, &["nvidia-cuda-nvrtc"]);
    }
    assert_eq!(files(root), before, "something was written");
    assert!(
        started.elapsed().as_secs() < 60,
        "refusals must be immediate, took {:?}",
        started.elapsed()
    );
}

#[test]
fn a_model_on_the_cpu_is_still_a_choice() {
    let d = lab();
    let model = synth_tiny(d.path());
    let bench = |extra: &[&str]| {
        no_gpu(d.path())
            .current_dir(d.path())
            .args(["bench", "-m", &model, "-p", "8", "-n", "2", "-r", "1"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = bench(&["--backend", "cuda"]);
    one_line_exit_4(&o, &["--backend cuda", "no CUDA GPU"]);
    let o = bench(&["--backend", "cpu"]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let o = bench(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    assert!(
        text(&o.stderr).contains("measuring the CPU engine"),
        "auto says it fell back: {}",
        log(&o)
    );
    assert!(text(&o.stdout).contains("| cpu |"), "{}", log(&o));
}

/// Writes `text` as a profile file and returns its path.
fn profile(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(format!("{name}.toml"));
    std::fs::write(&p, text).unwrap();
    p.to_string_lossy().into_owned()
}

/// `run`, `logits` and `bench` on the CPU backend (explicit and auto) with
/// `extra` flags.
fn each_engine_command(dir: &Path, model: &str, extra: &[&str]) -> Vec<(String, Output)> {
    let out = dir.join("logits.f32");
    let forms: Vec<Vec<String>> = vec![
        vec!["run", "-p", "hi", "-n", "2", "--backend", "cpu"],
        vec!["run", "-p", "hi", "-n", "2"],
        vec!["logits", "--tokens", "2,3", "--out", out.to_str().unwrap()],
        vec![
            "bench",
            "-m",
            model,
            "-p",
            "8",
            "-n",
            "2",
            "-r",
            "1",
            "--backend",
            "cpu",
        ],
    ]
    .into_iter()
    .map(|v| v.into_iter().map(String::from).collect())
    .collect();
    forms
        .into_iter()
        .map(|f| {
            let o = no_gpu(dir)
                .current_dir(dir)
                .args(&f)
                .args(extra)
                .output()
                .unwrap();
            (format!("{} {}", f.join(" "), extra.join(" ")), o)
        })
        .collect()
}

#[test]
fn profiles_tuned_tables_and_devices_are_checked_on_the_cpu() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path();
    let model = synth_tiny(dir);
    let expect_4 = |extra: &[&str], needles: &[&str]| {
        for (what, o) in each_engine_command(dir, &model, extra) {
            assert_eq!(o.status.code(), Some(4), "{what}: {}", log(&o));
            let err = text(&o.stderr);
            for n in needles {
                assert!(err.contains(n), "{what}: `{n}` missing: {}", log(&o));
            }
        }
    };
    expect_4(
        &["--profile", "nonexistent"],
        &["unknown profile 'nonexistent'"],
    );
    let syntax = profile(
        dir,
        "syntax",
        "name = \"syntax\"\nbase = \"main\"\n[slot.gemv\nfamily = \"gemv\"\n",
    );
    expect_4(&["--profile", &syntax], &[&format!("{syntax}:3:")]);
    let family = profile(
        dir,
        "family",
        "name = \"family\"\nbase = \"main\"\n\n[slot.gemv]\nfamily = \"gemvv\"\n",
    );
    expect_4(
        &["--profile", &family],
        &[&format!("{family}:5"), "'gemvv'", "not a kernel family"],
    );
    let slot = profile(
        dir,
        "slot",
        "name = \"slot\"\nbase = \"main\"\n[slot.gemmv]\nfamily = \"gemv\"\n",
    );
    expect_4(
        &["--profile", &slot],
        &[&format!("{slot}:3"), "'gemmv' is not an engine slot"],
    );
    let define = profile(
        dir,
        "define",
        "name = \"define\"\nbase = \"main\"\n[slot.gemv]\nfamily = \"gemv\"\ndefines = { ALGOO = 1 }\n",
    );
    expect_4(
        &["--profile", &define],
        &[&format!("{define}:5"), "ALGOO", "does not declare"],
    );
    // A value no variant has: refused by the family on every device, as
    // the CUDA engine's planner refuses it.
    let algo = profile(
        dir,
        "algo",
        "name = \"algo\"\nbase = \"main\"\n\n[slot.gemv]\nfamily = \"gemv\"\ndefines = { ALGO = 99, LAYOUT = 1, ROWS = 2, WARPS = 2, FUSE = 0, KSPLIT = 1, UNROLL = 1 }\n",
    );
    expect_4(&["--profile", &algo], &[&format!("{algo}:4"), "ALGO", "99"]);
    expect_4(
        &["--tuned", "/nonexistent.toml"],
        &["/nonexistent.toml", "cannot read"],
    );
    let table = std::fs::read_to_string(common::repo_root().join("variants/tuned/sm_90.toml"))
        .unwrap()
        .replacen("family = \"gemm_wgmma\"", "family = \"gemm_wgmmx\"", 1);
    let line = table.lines().position(|l| l.trim() == "[[entry]]").unwrap() + 1;
    let tuned = dir.join("tuned.toml");
    std::fs::write(&tuned, table).unwrap();
    let tuned = tuned.to_string_lossy().into_owned();
    expect_4(
        &["--tuned", &tuned],
        &[&format!("{tuned}:{line}"), "gemm_wgmmx"],
    );
    expect_4(&["--device", "7"], &["--device 7"]);
    // The committed profiles and a valid file still run.
    let fine = profile(
        dir,
        "fine",
        "name = \"fine\"\nbase = \"main\"\n[slot.gemv]\nfamily = \"gemv\"\ndefines = { ALGO = 1, LAYOUT = 1, ROWS = 4, WARPS = 4, FUSE = 0, KSPLIT = 1, UNROLL = 1 }\n",
    );
    for extra in [&["--profile", "flash-swa"][..], &["--profile", &fine][..]] {
        for (what, o) in each_engine_command(dir, &model, extra) {
            assert_eq!(o.status.code(), Some(0), "{what}: {}", log(&o));
        }
    }
}
