//! Sweeps that scale, on the CPU: shards partition the cells, `merge` joins
//! shard reports and refuses mismatched ones, a run resumes from its
//! results log after a kill, and compile-only worker processes give the
//! rows of one process. The compile-only runs need NVRTC (they fail loudly
//! without it); the GPU runs of the same paths are the ignored tests at
//! the end.

mod common;

use gemtune::cells::{select, work_cells, Shard};
use gemtune::checker::{load_jobs, plan_jobs};
use gemtune::results::{read_csv, CheckRow, TuneRow};
use gemtune::results_cache::{ResultsLog, LOG_FILE};
use gemtune::run_info::RunInfo;
use gemtune_kernels::compile::Arch;
use gemtune_kernels::family::DeviceLimits;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn vdir() -> PathBuf {
    common::repo_root().join("variants")
}

/// Every cell lands in exactly one of N shards, for several N, families
/// and shapes files; the split depends on nothing but the plan.
#[test]
fn shards_partition_the_cells() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["gemv"], &[]),
        (&["attn_decode"], &[]),
        (&["mmq", "gemm_dq"], &["edge.toml"]),
        (&["rmsnorm", "softcap", "quantize_q8_1"], &[]),
    ];
    for (fams, shapes) in cases {
        let fams: Vec<String> = fams.iter().map(|s| s.to_string()).collect();
        let shapes: Vec<String> = shapes.iter().map(|s| s.to_string()).collect();
        let jobs = load_jobs(&vdir(), &fams, &shapes, &[], &[], &[]).expect("load");
        let planned = plan_jobs(&jobs, &DeviceLimits::for_arch(Arch(90)));
        let all = work_cells(&jobs, &planned);
        assert!(all.len() > 4, "{fams:?}: only {} cells", all.len());
        let ids: Vec<_> = all.iter().map(|c| c.id.clone()).collect();
        let unique: BTreeSet<_> = ids.iter().cloned().collect();
        assert_eq!(unique.len(), ids.len(), "{fams:?}: cell ids repeat");
        for n in [1usize, 2, 3, 5, 8] {
            let mut seen: Vec<_> = Vec::new();
            let mut sizes = Vec::new();
            for i in 1..=n {
                let part = select(all.clone(), Some(Shard { index: i, count: n }));
                // The same shard again gives the same cells (no state).
                let again = select(all.clone(), Some(Shard { index: i, count: n }));
                assert_eq!(part, again);
                sizes.push(part.len());
                seen.extend(part.into_iter().map(|c| c.id));
            }
            seen.sort();
            let mut want = ids.clone();
            want.sort();
            assert_eq!(seen, want, "{fams:?} over {n} shards is not a partition");
            // Balanced within the largest define set.
            let biggest = {
                let mut per: std::collections::BTreeMap<(usize, &str), usize> = Default::default();
                for c in &all {
                    *per.entry((c.job, c.defines.as_str())).or_default() += 1;
                }
                per.values().copied().max().unwrap_or(0)
            };
            let (lo, hi) = (
                sizes.iter().copied().min().unwrap_or(0),
                sizes.iter().copied().max().unwrap_or(0),
            );
            assert!(
                hi - lo <= biggest,
                "{fams:?} over {n}: shard sizes {sizes:?} (largest define set {biggest})"
            );
        }
    }
}

fn require_nvrtc() {
    assert!(
        gemtune_kernels::compile::nvrtc_available(),
        "NVRTC could not be loaded: `. scripts/nvrtc-env.sh` (installs nvidia-cuda-nvrtc and sets LD_LIBRARY_PATH)"
    );
}

const FAMILIES: &str = "quantize_q8_1,softcap";

/// `gemtune check --compile-only` of `FAMILIES` into `out`.
fn check(out: &Path, extra: &[&str]) -> std::process::Output {
    check_cmd(FAMILIES, out, extra)
        .output()
        .expect("run gemtune")
}

fn check_cmd(families: &str, out: &Path, extra: &[&str]) -> std::process::Command {
    let mut c = common::gemtune();
    c.current_dir(common::repo_root())
        .args([
            "check",
            families,
            "--compile-only",
            "--arch",
            "sm_90",
            "--out",
        ])
        .arg(out)
        .args(extra);
    c
}

fn ok(o: &std::process::Output) {
    assert_eq!(o.status.code(), Some(0), "{}", common::log(o));
}

fn rows(dir: &Path) -> Vec<CheckRow> {
    read_csv(&dir.join("check.csv")).expect("check.csv")
}

fn sorted(mut v: Vec<CheckRow>) -> Vec<String> {
    let mut out: Vec<String> = v
        .drain(..)
        .map(|r| serde_json::to_string(&r).unwrap())
        .collect();
    out.sort();
    out
}

#[test]
fn merge_joins_shards_and_refuses_mismatches() {
    require_nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&check(&whole, &[]));
    let shards: Vec<PathBuf> = (1..=3).map(|i| tmp.path().join(format!("s{i}"))).collect();
    for (i, d) in shards.iter().enumerate() {
        ok(&check(d, &["--shard", &format!("{}/3", i + 1)]));
        let info = RunInfo::read(d).unwrap();
        assert_eq!(
            info.shards,
            vec![Shard {
                index: i + 1,
                count: 3
            }]
        );
    }
    let merged = tmp.path().join("merged");
    let o = common::gemtune()
        .arg("merge")
        .args(&shards)
        .arg("--out")
        .arg(&merged)
        .output()
        .unwrap();
    ok(&o);
    assert_eq!(sorted(rows(&merged)), sorted(rows(&whole)));
    let info = RunInfo::read(&merged).unwrap();
    assert_eq!(info.cells, RunInfo::read(&whole).unwrap().cells);
    assert_eq!(info.shards.len(), 3);

    // Each mismatch is refused with its reason, exit 4, nothing written.
    let tamper = |name: &str, edit: &dyn Fn(&mut RunInfo)| {
        let d = tmp.path().join(name);
        copy_dir(&shards[1], &d);
        let mut info = RunInfo::read(&d).unwrap();
        edit(&mut info);
        info.write(&d).unwrap();
        let out = tmp.path().join(format!("{name}-out"));
        let o = common::gemtune()
            .arg("merge")
            .arg(&shards[0])
            .arg(&d)
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
        assert!(!out.join("check.csv").exists());
        common::text(&o.stderr)
    };
    let e = tamper("nvrtc", &|i| i.nvrtc = "12.4".into());
    assert!(e.contains("NVRTC version differs"), "{e}");
    let e = tamper("source", &|i| {
        if let Some(h) = i.source_sha256.get_mut("softcap") {
            *h = "0".repeat(64);
        }
    });
    assert!(e.contains("kernel source hash of softcap differs"), "{e}");
    let gpu = |name: &str, driver: i32| gemtune::run_info::DeviceEntry {
        index: 0,
        name: name.into(),
        driver,
        pci_bus_id: "00000000:1B:00.0".into(),
    };
    let with_gpu = |dir: &Path, entry| {
        let mut info = RunInfo::read(dir).unwrap();
        info.devices = vec![entry];
        info.write(dir).unwrap();
    };
    let a = tmp.path().join("gpu-a");
    copy_dir(&shards[0], &a);
    with_gpu(&a, gpu("NVIDIA H100 80GB HBM3", 13000));
    let b = tmp.path().join("gpu-b");
    copy_dir(&shards[1], &b);
    with_gpu(&b, gpu("NVIDIA H200", 13000));
    let merge2 = |x: &Path, y: &Path, extra: &[&str]| {
        common::gemtune()
            .arg("merge")
            .arg(x)
            .arg(y)
            .args(extra)
            .arg("--out")
            .arg(tmp.path().join("m2"))
            .output()
            .unwrap()
    };
    let o = merge2(&a, &b, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
    assert!(common::text(&o.stderr).contains("device models differ"));
    ok(&merge2(&a, &b, &["--allow-mixed"]));
    with_gpu(&b, gpu("NVIDIA H100 80GB HBM3", 12080));
    let o = merge2(&a, &b, &["--allow-mixed"]);
    assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
    assert!(common::text(&o.stderr).contains("GPU drivers differ"));

    // The same shard twice is identical (kept once); a shard whose rows
    // differ for the same cell overlaps and is refused.
    ok(&merge2(&shards[0], &shards[0], &[]));
    let d = tmp.path().join("overlap");
    copy_dir(&shards[0], &d);
    let mut r = rows(&d);
    let i = r
        .iter()
        .position(|r| r.verdict == "compiled")
        .expect("a compiled row");
    r[i].registers = Some(r[i].registers.unwrap_or(0) + 1);
    gemtune::results::write_csv(&d.join("check.csv"), &r).unwrap();
    let o = merge2(&shards[0], &d, &[]);
    assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
    assert!(common::text(&o.stderr).contains("shards overlap"));
}

/// A run killed mid-way (its log cut inside a line) resumes: the finished
/// cells are not run again and the report equals an uninterrupted run's.
#[test]
fn resume_after_a_kill_gives_the_uninterrupted_cell_set() {
    require_nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&check(&whole, &[]));
    let log = std::fs::read_to_string(whole.join(LOG_FILE)).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert!(lines.len() >= 4, "{} records", lines.len());
    let cells = RunInfo::read(&whole).unwrap().cells;
    assert_eq!(lines.len(), cells, "one record per cell");

    // The kill: half the records, then half of the next line.
    let killed = tmp.path().join("killed");
    std::fs::create_dir_all(&killed).unwrap();
    let keep = lines.len() / 2;
    let mut cut: String = lines[..keep].iter().map(|l| format!("{l}\n")).collect();
    cut.push_str(&lines[keep][..lines[keep].len() / 2]);
    std::fs::write(killed.join(LOG_FILE), cut).unwrap();
    let o = check(&killed, &[]);
    ok(&o);
    let err = common::text(&o.stderr);
    assert!(err.contains("dropped an unterminated last line"), "{err}");
    assert!(
        err.contains(&format!("{keep} finished")),
        "expected {keep} finished cells:\n{err}"
    );
    assert_eq!(rows(&killed), rows(&whole));
    let back = ResultsLog::open(&killed.join(LOG_FILE)).unwrap();
    assert_eq!(back.unreadable, 0);
    let ids: BTreeSet<_> = back.records().iter().map(|r| r.cell.clone()).collect();
    assert_eq!(back.records().len(), cells, "finished cells were run again");
    assert_eq!(ids.len(), cells);

    // A rerun of a finished directory runs nothing; --resume needs a log.
    let o = check(&killed, &[]);
    ok(&o);
    assert!(common::text(&o.stderr).contains(&format!("{cells} finished")));
    let o = check(
        &tmp.path().join("x"),
        &["--resume", tmp.path().join("none").to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
}

/// A compile-only run killed (SIGKILL) while its worker compiles: the
/// rerun reads back every record the killed run completed, runs only the
/// rest, and ends with the rows of an uninterrupted run.
#[test]
fn a_run_killed_mid_way_resumes_without_losing_a_cell() {
    require_nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    let fam = "qk_norm_rope";
    let whole = tmp.path().join("whole");
    ok(&check_cmd(fam, &whole, &[]).output().unwrap());
    let cells = RunInfo::read(&whole).unwrap().cells;
    // One worker process compiling without the cubin cache: slow enough
    // to be killed after its first define sets.
    let part = tmp.path().join("part");
    let mut child = check_cmd(fam, &part, &["--no-cache", "--workers", "1"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let logged = || {
        std::fs::read(part.join(LOG_FILE))
            .map(|b| b.iter().filter(|&&c| c == b'\n').count())
            .unwrap_or(0)
    };
    let t0 = std::time::Instant::now();
    while logged() < 2 && t0.elapsed().as_secs() < 120 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), None, "the run ended before it was killed");
    let finished = ResultsLog::open(&part.join(LOG_FILE))
        .unwrap()
        .records()
        .len();
    assert!(finished >= 2 && finished < cells, "{finished} of {cells}");
    let o = check_cmd(fam, &part, &[]).output().unwrap();
    ok(&o);
    let err = common::text(&o.stderr);
    assert!(err.contains(&format!("{finished} finished")), "{err}");
    assert_eq!(rows(&part), rows(&whole));
    assert_eq!(
        ResultsLog::open(&part.join(LOG_FILE))
            .unwrap()
            .records()
            .len(),
        cells
    );
}

/// Compile-only worker processes, handed define sets as they finish,
/// give the rows of one process, and log every cell once.
#[test]
fn compile_only_workers_match_one_process() {
    require_nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    ok(&check(&one, &[]));
    let pool = tmp.path().join("pool");
    let o = check(&pool, &["--workers", "3"]);
    ok(&o);
    assert_eq!(rows(&pool), rows(&one));
    let log = ResultsLog::open(&pool.join(LOG_FILE)).unwrap();
    assert_eq!(log.records().len(), RunInfo::read(&pool).unwrap().cells);
    // Workers of a shard do the shard's cells only.
    let sh = tmp.path().join("shard");
    ok(&check(&sh, &["--workers", "2", "--shard", "2/2"]));
    let n = ResultsLog::open(&sh.join(LOG_FILE))
        .unwrap()
        .records()
        .len();
    assert!(n > 0 && n < log.records().len(), "{n}");
}

/// `scripts/ray-tune.py --local`: the shard commands in a local pool (no
/// Ray), their reports shipped back as archives and merged; the merged
/// rows are one run's. The Ray modes run the same `run_shard` as tasks.
#[test]
fn ray_script_local_mode_merges_the_shards_of_one_run() {
    require_nvrtc();
    let tmp = tempfile::tempdir().unwrap();
    let whole = tmp.path().join("whole");
    ok(&check(&whole, &[]));
    let out = tmp.path().join("ray");
    let o = std::process::Command::new("python3")
        .current_dir(common::repo_root())
        .arg(common::repo_root().join("scripts/ray-tune.py"))
        .args(["--local", "--num-cpus", "2", "--shards", "3", "--out"])
        .arg(&out)
        .args(["--", "check", FAMILIES, "--compile-only", "--arch", "sm_90"])
        .env("GEMTUNE", common::gemtune_bin())
        .env("GEMTUNE_CACHE_DIR", common::test_cache_dir())
        .output()
        .expect("python3");
    ok(&o);
    assert_eq!(sorted(rows(&out)), sorted(rows(&whole)));
    let info = RunInfo::read(&out).unwrap();
    assert_eq!(info.shards.len(), 3);
    assert_eq!(info.cells, RunInfo::read(&whole).unwrap().cells);
    // A failing shard command is exit 4, not a merge of what is there.
    let o = std::process::Command::new("python3")
        .current_dir(common::repo_root())
        .arg(common::repo_root().join("scripts/ray-tune.py"))
        .args(["--local", "--shards", "2", "--out"])
        .arg(tmp.path().join("bad"))
        .args(["--", "check", "no_such_family", "--compile-only"])
        .env("GEMTUNE", common::gemtune_bin())
        .output()
        .expect("python3");
    assert_eq!(o.status.code(), Some(4), "{}", common::log(&o));
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
}

// ---- GPU: run on a host with 2 or more GPUs of one model ----

fn gpu_count() -> usize {
    let n = gemtune_kernels::gpu::device_count().unwrap_or(0);
    assert!(n > 0, "needs a CUDA GPU: no GPU visible");
    n
}

fn tune(out: &Path, extra: &[&str]) -> std::process::Output {
    tune_cmd(out, extra).output().expect("run gemtune")
}

/// A small gemv sweep: 2 shapes x 2 token counts x every variant, L2 only.
fn tune_cmd(out: &Path, extra: &[&str]) -> std::process::Command {
    let mut c = common::gemtune();
    c.current_dir(common::repo_root())
        .args(["tune", "gemv", "--shapes", "decode.toml", "--tokens", "1,4"])
        .args([
            "--shape",
            "e4b.ffn_up",
            "--shape",
            "e4b.attn_q",
            "--regime",
            "l2",
        ])
        .args(["--budget-ms", "10", "--min-reps", "5", "--max-reps", "20"])
        .args(["--no-reference", "--out"])
        .arg(out)
        .args(extra);
    c
}

/// Every GPU of the host: the same cells as one GPU, rows of every GPU,
/// the same verdicts.
#[test]
#[ignore = "needs a CUDA GPU"]
fn tune_on_every_gpu_times_the_cells_of_one_gpu() {
    let n = gpu_count();
    assert!(n >= 2, "needs 2 or more GPUs, found {n}");
    let tmp = tempfile::tempdir().unwrap();
    let one = tmp.path().join("one");
    ok(&tune(&one, &["--devices", "0"]));
    let all = tmp.path().join("all");
    ok(&tune(&all, &[]));
    let cells = |d: &Path| -> BTreeSet<(String, String, String)> {
        read_csv::<TuneRow>(&d.join("results.csv"))
            .unwrap()
            .into_iter()
            .filter(|r| r.is_timed())
            .map(|r| (r.variant, r.shape, r.regime))
            .collect()
    };
    assert!(!cells(&one).is_empty(), "nothing timed on one GPU");
    assert_eq!(cells(&one), cells(&all));
    let used: BTreeSet<Option<usize>> = read_csv::<TuneRow>(&all.join("results.csv"))
        .unwrap()
        .into_iter()
        .map(|r| r.device_index)
        .collect();
    assert_eq!(used.len(), n, "rows name GPUs {used:?}");
    let verdicts = |d: &Path| -> Vec<(String, String, String)> {
        let mut v: Vec<_> = rows(d)
            .into_iter()
            .map(|r| (r.variant, r.shape, r.verdict))
            .collect();
        v.sort();
        v
    };
    assert_eq!(verdicts(&one), verdicts(&all));
}

/// A GPU check on every GPU, and a tune stopped by SIGTERM then resumed:
/// the resumed report holds every cell of an uninterrupted one, and the
/// timings finished before the stop are not measured again.
#[test]
#[ignore = "needs a CUDA GPU"]
fn gpu_check_pool_and_tune_resume() {
    gpu_count();
    let tmp = tempfile::tempdir().unwrap();
    let c = tmp.path().join("check");
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args(["check", "gemv", "--shapes", "decode.toml", "--tokens", "1"])
        .args(["--shape", "e4b.ffn_up", "--out"])
        .arg(&c)
        .output()
        .unwrap();
    ok(&o);
    assert!(rows(&c)
        .iter()
        .any(|r| r.verdict == "pass" && r.device_index.is_some()));

    let whole = tmp.path().join("whole");
    ok(&tune(&whole, &[]));
    let part = tmp.path().join("part");
    let mut child = tune_cmd(&part, &[]).spawn().unwrap();
    // Stop it once some timings are logged.
    let logp = part.join(LOG_FILE);
    let timings = || {
        std::fs::read_to_string(&logp)
            .map(|t| t.matches("\"stage\":\"l2\"").count())
            .unwrap_or(0)
    };
    for _ in 0..600 {
        if timings() >= 2 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130), "SIGTERM exits 130");
    let before = timings();
    assert!(before >= 2, "{before} timings logged before the stop");
    let o = tune(&part, &[]);
    ok(&o);
    let err = common::text(&o.stderr);
    assert!(
        err.contains(&format!("{before} timings finished")),
        "the resume reuses the {before} logged timings:\n{err}"
    );
    let key = |d: &Path| -> BTreeSet<(String, String)> {
        read_csv::<TuneRow>(&d.join("results.csv"))
            .unwrap()
            .into_iter()
            .filter(|r| r.is_timed())
            .map(|r| (r.variant, r.shape))
            .collect()
    };
    assert!(!key(&whole).is_empty());
    assert_eq!(key(&part), key(&whole));
}
