//! SIGINT and SIGTERM sent to a running `gemtune`: `ab` stops both of its
//! workers (killed and reaped: no process survives it) and removes the
//! numerics gate's temporary logit files, keeping its report directory;
//! `bench` stops; each exits 130. `ab` runs against the fake worker
//! (python3), so the CPU machine can test it; `tune` and the synthetic
//! model `bench` writes need a GPU (ignored tests at the end).
#![cfg(unix)]

mod common;

use common::{log, text};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn wait_for(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether `pid` is a live process (a zombie counts: nobody reaped it).
fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn signal(child: &Child, sig: Signal) {
    kill(Pid::from_raw(child.id() as i32), sig).expect("send the signal");
}

/// A scratch checkout with two profiles and the fake worker.
struct Lab {
    dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Lab {
        let dir = tempfile::tempdir().unwrap();
        let prof = dir.path().join("variants/profiles");
        std::fs::create_dir_all(&prof).unwrap();
        std::fs::create_dir_all(dir.path().join("variants/shapes")).unwrap();
        for p in ["main", "cand"] {
            std::fs::write(prof.join(format!("{p}.toml")), "# fake\n").unwrap();
        }
        let worker = dir.path().join("fake_worker.py");
        std::fs::copy(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_worker.py"),
            &worker,
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
        Lab { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `gemtune ab main vs cand` with the fake worker's `env`, started.
    fn start_ab(&self, env: &[(&str, &str)]) -> Child {
        common::gemtune()
            .current_dir(self.dir.path())
            .args([
                "ab",
                "--baseline",
                "main",
                "--candidate",
                "cand",
                "--worker",
            ])
            .arg(self.path("fake_worker.py"))
            .args(["-p", "64", "-n", "8", "--reps", "8"])
            .args(["--gate-lengths", "5,17", "--out"])
            .arg(self.path("out"))
            .env("FAKE_COUNTER", self.path("counter"))
            .env("FAKE_PIDS", self.path("pids"))
            .env("FAKE_HANG_MARK", self.path("hang.mark"))
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gemtune")
    }

    fn worker_pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.path("pids"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

/// Interrupts `ab` with `sig` once a worker hangs on `hang_on` and checks
/// what is left: no worker, no gate-tmp, the report directory and its logs.
fn interrupt_ab(sig: Signal, hang_on: &str) {
    let lab = Lab::new();
    let child = lab.start_ab(&[("FAKE_HANG_ON_CAND", hang_on)]);
    wait_for("the candidate to hang", 60, || {
        lab.path("hang.mark").exists()
    });
    let pids = lab.worker_pids();
    assert_eq!(pids.len(), 2, "two workers started");
    assert!(pids.iter().all(|&p| alive(p)), "both workers run");
    let tmp = lab.path("out/gate-tmp");
    if hang_on == "logits" {
        assert!(tmp.is_dir(), "the gate's files exist while it runs");
    }
    let started = Instant::now();
    signal(&child, sig);
    let o = child.wait_with_output().expect("wait for gemtune");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{sig}: took {:?}\n{}",
        started.elapsed(),
        log(&o)
    );
    assert_eq!(o.status.code(), Some(130), "{sig}: {}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("interrupted: stopped 2 child process(es)"),
        "{sig}: {}",
        log(&o)
    );
    assert!(
        !err.contains("error:"),
        "no error besides the interrupt: {err}"
    );
    for p in pids {
        assert!(!alive(p), "{sig}: worker {p} survived");
    }
    assert!(!tmp.exists(), "{sig}: {} left behind", tmp.display());
    assert!(
        lab.path("out/worker-baseline.log").is_file()
            && lab.path("out/worker-candidate.log").is_file(),
        "{sig}: the report directory keeps the workers' logs"
    );
}

#[test]
fn sigint_in_the_numerics_gate_stops_both_workers_and_removes_its_files() {
    interrupt_ab(Signal::SIGINT, "logits");
}

#[test]
fn sigterm_while_timing_stops_both_workers() {
    interrupt_ab(Signal::SIGTERM, "bench");
}

#[test]
fn bench_stops_on_sigterm() {
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("tiny.gguf");
    let o = common::gemtune()
        .args(["synth", "tiny", "q8_0"])
        .arg(&m)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let mut child = common::gemtune()
        .current_dir(d.path())
        .args([
            "bench",
            "--backend",
            "cpu",
            "-p",
            "16",
            "-n",
            "4",
            "-r",
            "100000",
            "-m",
        ])
        .arg(&m)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it is timing repetitions.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut l = String::new();
        assert!(
            err.read_line(&mut l).unwrap() > 0,
            "bench ended early: {seen}"
        );
        seen.push_str(&l);
        if l.contains(": rep ") {
            break;
        }
    }
    let started = Instant::now();
    signal(&child, Signal::SIGTERM);
    let status = child.wait().unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(status.code(), Some(130), "{seen}");
    let left: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("tiny.gguf")]);
}

/// `bench` without `-m` in a fresh checkout writes the synthetic E4B; a
/// SIGINT while it writes removes the partial file.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bench_interrupted_while_writing_its_model_leaves_no_partial_file() {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(d.path().join("variants")).unwrap();
    let mut child = common::gemtune()
        .current_dir(d.path())
        .args(["bench", "-p", "16", "-n", "4", "-r", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let partial = d
        .path()
        .join("target/gemtune/models/e4b-q8_0-seed0.gguf.partial");
    wait_for("the partial model file", 120, || partial.exists());
    signal(&child, Signal::SIGINT);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!partial.exists(), "{} left behind", partial.display());
}

/// `tune` on SIGTERM finishes the current measurement, writes the report
/// of what it measured (no promotion) and exits 130.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tune_on_sigterm_writes_what_it_measured() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tune");
    let mut child = common::gemtune()
        .current_dir(common::repo_root())
        .args([
            "tune",
            "gemv",
            // One shape and token count: a few dozen cells, so the first
            // timings come after seconds of checking, not after the spec's
            // thousands of default cells, and cells are left when it stops.
            "--shapes",
            "decode.toml",
            "--shape",
            "e4b.ffn_up",
            "--tokens",
            "1",
            "--regime",
            "dram",
            "--no-reference",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Finished stages reach the results log (cells.jsonl) as they finish;
    // the report files are written when the run stops.
    let timings = || {
        std::fs::read_to_string(out.join("cells.jsonl"))
            .map(|t| t.matches("\"stage\":\"dram\"").count())
            .unwrap_or(0)
    };
    wait_for("the first timed row", 600, || timings() >= 2);
    signal(&child, Signal::SIGTERM);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let summary = std::fs::read_to_string(out.join("summary.md")).expect("summary.md");
    assert!(summary.contains("interrupted"), "{summary}");
    let rows: Vec<gemtune::results::TuneRow> =
        gemtune::results::read_csv(&out.join("results.csv")).expect("results.csv");
    assert!(
        rows.iter().filter(|r| r.is_timed()).count() >= timings(),
        "every logged timing is in results.csv"
    );
}
