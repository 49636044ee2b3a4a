//! `gemtune bench`'s per-step accounting: tg rows carry the bytes a decode
//! step must move, the floor time of those bytes at the memory rate and
//! the share of it the step reaches; pp rows carry none of it.
//! - CPU (no GPU needed): the columns exist, the tg row's step bytes are
//!   the CPU engine's reads, and without `--hbm-gbps` there is no floor
//!   (empty CSV fields, '-' in the table); with it, the floor follows.
//! - GPU (ignored; `--include-ignored` on a GPU host): on a tiny synthetic
//!   model the floor share lies in (0, 100], and `--profile-phases` prints
//!   a graph-decode phase table whose phases fit inside the step.

mod common;

use common::{log, text};

use std::path::Path;
use std::process::{Command, Output};

use gemtune::results::BenchRow;
use gemtune_engine::model::Model;
use gemtune_engine::step_bytes::StepReads;

/// `gemtune` with its scratch and cache directories in `home`.
fn gemtune_in(home: &Path) -> Command {
    let mut c = common::gemtune();
    c.current_dir(home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("HOME", home);
    c
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

fn rows(o: &Output) -> Vec<BenchRow> {
    csv::Reader::from_reader(o.stdout.as_slice())
        .deserialize()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("bench CSV: {e}\n{}", log(o)))
}

const NEW_COLUMNS: [&str; 5] = [
    "step_bytes",
    "step_kv_bytes",
    "hbm_gbps",
    "floor_ms",
    "floor_pct",
];

#[test]
fn cpu_tg_rows_carry_the_step_bytes_and_no_floor_without_a_rate() {
    let d = tempfile::tempdir().unwrap();
    let model = synth_tiny(d.path());
    let bench = |extra: &[&str]| {
        gemtune_in(d.path())
            .env("CUDA_VISIBLE_DEVICES", "")
            .args([
                "bench", "-m", &model, "-p", "8", "-n", "3", "-d", "20", "-r", "1",
            ])
            .args(["--backend", "cpu"])
            .args(extra)
            .output()
            .unwrap()
    };
    let o = bench(&["-o", "csv"]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let out = text(&o.stdout);
    let header = out.lines().next().unwrap_or("");
    for c in NEW_COLUMNS {
        assert!(header.split(',').any(|h| h == c), "no {c} column: {header}");
    }
    let r = rows(&o);
    assert_eq!(r.len(), 2, "{}", log(&o));
    let (pp, tg) = (&r[0], &r[1]);
    assert!(pp.test.starts_with("pp8") && tg.test.starts_with("tg3"));
    assert_eq!(
        (pp.step_bytes, pp.floor_ms, pp.floor_pct),
        (None, None, None),
        "pp rows carry no accounting"
    );
    // The CPU engine's reads over steps at positions 20, 21 and 22.
    let m = Model::load(&model).unwrap();
    let want = StepReads::of_cpu_model(&m).mean_step(m.config(), 20, 3);
    assert_eq!(tg.step_bytes, Some(want.total()));
    assert_eq!(tg.step_kv_bytes, Some(want.kv()));
    assert!(want.kv_read > 0 && want.matrices > want.kv_read);
    assert_eq!((tg.hbm_gbps, tg.floor_ms, tg.floor_pct), (None, None, None));
    // Empty CSV fields, not a made-up number.
    let tg_line = out.lines().nth(2).unwrap_or("");
    let fields: Vec<&str> = tg_line.split(',').collect();
    for c in ["hbm_gbps", "floor_ms", "floor_pct"] {
        let i = header.split(',').position(|h| h == c).expect("column");
        assert_eq!(fields.get(i), Some(&""), "no {c} on the CPU: {tg_line}");
    }

    // A rate given: the floor follows from the bytes and the row's speed.
    let o = bench(&["-o", "csv", "--hbm-gbps", "50"]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let tg = rows(&o).pop().unwrap();
    let bytes = tg.step_bytes.expect("step bytes") as f64;
    let floor = tg.floor_ms.expect("a floor at the given rate");
    assert_eq!(tg.hbm_gbps, Some(50.0));
    assert!((floor - bytes / 50e9 * 1e3).abs() < 1e-12 * floor.max(1.0));
    let pct = tg.floor_pct.expect("floor share");
    assert!((pct - floor * tg.tps_mean / 10.0).abs() < 1e-9 * pct.max(1.0));
    assert!(pct > 0.0, "{pct}");

    // The table says '-' where there is nothing to say.
    let o = bench(&[]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let md = text(&o.stdout);
    assert!(
        md.contains("| ubatch | t/s | GFLOP/t | TFLOP/s | step MB | floor ms | floor % |"),
        "{md}"
    );
    let pp_line = md.lines().find(|l| l.contains("| pp8")).unwrap_or("");
    assert!(pp_line.ends_with("| - | - | - |"), "{pp_line}");
    let tg_line = md.lines().find(|l| l.contains("| tg3")).unwrap_or("");
    assert!(tg_line.ends_with("| - | - |"), "{tg_line}");
    assert!(!tg_line.ends_with("| - | - | - |"), "{tg_line}");
}

/// Every row states the work it measured: the ubatch the engine ran and
/// the GFLOP per token of `work::forward_work` for that test; `--full-work`
/// runs every layer over every row (rows labelled `full`), which on the
/// tiny model (KV-shared layers 4 and 5) is more work per prompt token
/// and the same per decode step.
#[test]
fn cpu_rows_state_their_work_and_full_work_runs_every_row() {
    use gemtune_engine::forward::LogitRows;
    use gemtune_engine::work::{forward_work, RowWork};
    let d = tempfile::tempdir().unwrap();
    let model = synth_tiny(d.path());
    let bench = |extra: &[&str]| {
        let o = gemtune_in(d.path())
            .env("CUDA_VISIBLE_DEVICES", "")
            .args(["bench", "-m", &model, "-p", "24", "-n", "2", "-d", "5"])
            .args(["-r", "1", "--ubatch", "8", "--backend", "cpu"])
            .args(extra)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", log(&o));
        o
    };
    let m = Model::load(&model).unwrap();
    let cfg = m.config();
    let trimmed = rows(&bench(&["-o", "csv"]));
    let full = rows(&bench(&["-o", "csv", "--full-work"]));
    for (r, rw) in [(&trimmed, RowWork::Trimmed), (&full, RowWork::Full)] {
        let (pp, tg) = (&r[0], &r[1]);
        assert_eq!((pp.ubatch, tg.ubatch), (8, 8));
        assert_eq!(
            (pp.row_work.as_str(), tg.row_work.as_str()),
            (rw.name(), rw.name())
        );
        let want = forward_work(cfg, 5, 24, 8, LogitRows::Last, rw).gflop_per_token(24);
        assert_eq!(pp.gflop_per_token, Some(want), "{rw:?}");
        let step = |p| forward_work(cfg, p, 1, 8, LogitRows::Last, rw).total_flop();
        let want_tg = (step(5) + step(6)) / 1e9 / 2.0;
        assert_eq!(tg.gflop_per_token, Some(want_tg), "{rw:?}");
    }
    assert_eq!(
        (trimmed[0].test.as_str(), full[0].test.as_str()),
        ("pp24 @ d5", "pp24 @ d5 full")
    );
    let (t, f) = (
        trimmed[0].gflop_per_token.unwrap(),
        full[0].gflop_per_token.unwrap(),
    );
    assert!(f > t * 1.05, "full work {f} vs trimmed {t} GFLOP/t");
    assert_eq!(trimmed[1].gflop_per_token, full[1].gflop_per_token);
    // The table names the trimmed layers.
    let md = text(&bench(&[]).stdout);
    assert!(
        md.contains("Layers 4..5 (no KV cache written) ran only the rows"),
        "{md}"
    );
    let md = text(&bench(&["--full-work"]).stdout);
    assert!(!md.contains("ran only the rows"), "{md}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_tg_rows_reach_a_share_of_the_floor_and_phases_fit_the_step() {
    let d = tempfile::tempdir().unwrap();
    let model = synth_tiny(d.path());
    let o = gemtune_in(d.path())
        .args(["bench", "-m", &model, "-p", "0", "-n", "64", "-r", "3"])
        .args(["--backend", "cuda", "-o", "csv", "--profile-phases"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "this test needs a CUDA GPU: {}",
        log(&o)
    );
    let r = rows(&o);
    let tg = r.iter().find(|r| r.n_gen > 0).expect("a tg row");
    let gbps = tg.hbm_gbps.expect("the HBM rate was measured");
    assert!(gbps > 100.0, "HBM {gbps} GB/s");
    let pct = tg.floor_pct.expect("a floor share");
    assert!(pct > 0.0 && pct <= 100.0, "floor {pct} %: {}", log(&o));
    let err = text(&o.stderr);
    assert!(err.contains("HBM read rate"), "{err}");
    assert!(
        err.contains("graph decode"),
        "decode phases from the graph: {err}"
    );
    let value = |name: &str| -> f64 {
        err.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l[name.len()..].split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no `{name}` line: {err}"))
    };
    let (sum, replay, step) = (
        value("sum of phases"),
        value("graph replay"),
        value("step (timed)"),
    );
    // The phases are the replay's span less its start; the replay runs
    // within the step's wall time.
    assert!(
        sum <= replay * 1.0001 && sum >= 0.95 * replay,
        "phases {sum} ms against the replay's {replay} ms"
    );
    assert!(replay <= step, "replay {replay} ms in a step of {step} ms");
    assert!(value("gap") >= 0.0);
}
