//! The CLI contract, from the built binary: every exit code of the README's
//! table, usage errors as exit 4, each validated flag at and past its
//! bounds (negative values reach the flag's own range message), the
//! llama.cpp spellings, NVRTC failing fast, `--arch` against what NVRTC
//! targets and recorded as asked, a shapes file's wrong key named, the
//! main command's first line, and reports kept out of the source tree.

mod common;

use common::{log, text};

use std::path::Path;
use std::process::Output;

fn gemtune_in(dir: &Path, args: &[&str]) -> Output {
    common::gemtune()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("spawn gemtune")
}

fn gemtune(args: &[&str]) -> Output {
    gemtune_in(&common::repo_root(), args)
}

fn require_nvrtc() {
    assert!(
        gemtune_kernels::compile::nvrtc_available(),
        "NVRTC cannot be loaded: run `. scripts/nvrtc-env.sh` first"
    );
}

/// The exit codes the README's table lists: `| 0 | ... |` rows under the
/// "Exit codes" heading.
fn readme_exit_codes() -> Vec<i32> {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    let section = readme
        .split("### Exit codes")
        .nth(1)
        .expect("README has an '### Exit codes' section");
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.trim_matches('|').split('|').next()?.trim().parse().ok())
        .collect()
}

/// A `gemtune ab` against the fake worker in a scratch variants folder with
/// profiles `main` and `cand`; `env` sets the fake worker's knobs.
fn fake_ab(env: &[(&str, &str)]) -> Output {
    let lab = tempfile::tempdir().unwrap();
    fake_ab_command(lab.path(), env)
        .output()
        .expect("spawn gemtune")
}

/// `fake_ab` with the candidate hanging in the numerics gate, stopped by
/// SIGINT once it hangs.
#[cfg(unix)]
fn interrupted_ab() -> Output {
    let lab = tempfile::tempdir().unwrap();
    let mark = lab.path().join("hang.mark");
    let child = fake_ab_command(
        lab.path(),
        &[
            ("FAKE_HANG_ON_CAND", "logits"),
            ("FAKE_HANG_MARK", mark.to_str().unwrap()),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("spawn gemtune");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !mark.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(mark.exists(), "the candidate never reached the gate");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .expect("kill -INT");
    child.wait_with_output().expect("wait for gemtune")
}

fn fake_ab_command(dir: &Path, env: &[(&str, &str)]) -> std::process::Command {
    let prof = dir.join("variants/profiles");
    std::fs::create_dir_all(&prof).unwrap();
    // variants/ is recognised by its profiles/ and shapes/ folders.
    std::fs::create_dir_all(dir.join("variants/shapes")).unwrap();
    for p in ["main", "cand"] {
        std::fs::write(prof.join(format!("{p}.toml")), "# fake\n").unwrap();
    }
    let worker = dir.join("fake_worker.py");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_worker.py"),
        &worker,
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&worker, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = dir.join("out");
    let mut c = common::gemtune();
    c.current_dir(dir)
        .args([
            "ab",
            "--baseline",
            "main",
            "--candidate",
            "cand",
            "--worker",
        ])
        .arg(&worker)
        .args(["-p", "64", "-n", "8", "--reps", "8", "--quiet"])
        .args(["--gate-lengths", "5,17", "--out"])
        .arg(&out)
        .env("FAKE_COUNTER", dir.join("counter"))
        .envs(env.iter().copied());
    c
}

#[test]
fn every_exit_code_in_the_readme_table_comes_from_the_binary() {
    let codes = readme_exit_codes();
    assert_eq!(codes, vec![0, 1, 2, 3, 4, 130], "README exit-code table");
    for code in codes {
        let o = match code {
            0 => gemtune(&["--version"]),
            1 => {
                // A compile report whose first row gained a spill.
                let d = tempfile::tempdir().unwrap();
                let base = common::repo_root().join("reports/baseline/compile.csv");
                let text = std::fs::read_to_string(&base).unwrap();
                let mut lines: Vec<String> = text.lines().map(String::from).collect();
                let header: Vec<&str> = lines[0].split(',').collect();
                let col = header.iter().position(|h| *h == "spill_bytes").unwrap();
                let mut row: Vec<String> = lines[1].split(',').map(String::from).collect();
                row[col] = "64".into();
                lines[1] = row.join(",");
                let cur = d.path().join("compile.csv");
                std::fs::write(&cur, lines.join("\n") + "\n").unwrap();
                let out = d.path().join("report");
                let (b, c, o) = (
                    base.to_string_lossy().into_owned(),
                    cur.to_string_lossy().into_owned(),
                    out.to_string_lossy().into_owned(),
                );
                gemtune(&["report", "--baseline", &b, "--current", &c, "--out", &o])
            }
            2 => fake_ab(&[("FAKE_NOISE", "0.2"), ("FAKE_SEED", "3")]),
            3 => fake_ab(&[("FAKE_LOGIT_DELTA_CAND", "5")]),
            4 => gemtune(&["run", "--no-such-flag"]),
            #[cfg(unix)]
            130 => interrupted_ab(),
            other => panic!("README lists exit code {other}, which has no scenario here"),
        };
        assert_eq!(o.status.code(), Some(code), "{}", log(&o));
    }
}

#[test]
fn usage_errors_exit_4_and_help_and_version_exit_0() {
    for args in [
        &["--help"][..],
        &["--version"][..],
        &["run", "--help"][..],
        &["ab", "--help"][..],
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", log(&o));
    }
    for (args, msg) in [
        (&["run", "--no-such-flag"][..], "--no-such-flag"),
        (&["no-such-command"][..], "no-such-command"),
        (&["run", "--backend", "tpu"][..], "tpu"),
        (&["synth"][..], "required"),
        (&["report", "--current", "x.csv"][..], "--baseline"),
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", log(&o));
        assert!(text(&o.stderr).contains(msg), "{args:?}: {}", log(&o));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        let bad = std::ffi::OsStr::from_bytes(&[b'-', b'p', 0xff, 0xfe]);
        let o = common::gemtune()
            .args(["run".as_ref(), bad])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(4), "invalid UTF-8: {}", log(&o));
    }
}

#[test]
fn values_are_validated_at_parse_time_naming_the_flag() {
    for (args, flag) in [
        (&["run", "-p", "x", "--temp", "-1"][..], "--temp"),
        (&["run", "-p", "x", "--temp", "nan"][..], "--temp"),
        (&["run", "-p", "x", "--temp", "inf"][..], "--temp"),
        (&["run", "-p", "x", "--top-p", "1.5"][..], "--top-p"),
        (&["run", "-p", "x", "--min-p", "-0.1"][..], "--min-p"),
        (&["run", "-p", "x", "--top-k", "-1"][..], "--top-k"),
        (&["run", "-p", "x", "-n", "-2"][..], "-n"),
        (&["run", "-p", "x", "--batch", "0"][..], "--batch"),
        (&["run", "-p", "x", "-b", "0"][..], "--batch"),
        (&["run", "-p", "x", "--ubatch", "0"][..], "--ubatch"),
        (&["run", "-p", "x", "--seed", "-1"][..], "--seed"),
        (&["bench", "-n", "-1"][..], "--n-gen"),
        (&["check", "--tokens", "8,-1"][..], "--tokens"),
        (
            &["logits", "--tokens", "2", "--out", "x", "--device", "-1"][..],
            "--device",
        ),
        (&["bench", "-r", "0"][..], "--repetitions"),
        (
            &["ab", "--baseline", "a", "--candidate", "b", "--reps", "5"][..],
            "--reps",
        ),
        (
            &[
                "ab",
                "--baseline",
                "a",
                "--candidate",
                "b",
                "--min-effect",
                "0",
            ][..],
            "--min-effect",
        ),
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", log(&o));
        assert!(text(&o.stderr).contains(flag), "{args:?}: {}", log(&o));
    }
}

#[test]
fn boundary_values_and_llama_cpp_spellings_are_accepted() {
    for args in [
        &["run", "-p", "x", "-n", "2", "--temp", "0", "--raw"][..],
        &[
            "run", "-p", "x", "-n", "2", "--top-p", "1", "--min-p", "0", "--top-k", "0",
        ][..],
        &[
            "run",
            "-p",
            "x",
            "-n",
            "2",
            "--seed",
            "18446744073709551615",
        ][..],
        &[
            "run", "-p", "x", "-n", "2", "-s", "7", "-b", "16", "-ub", "8", "-c", "64",
        ][..],
        &[
            "run",
            "-p",
            "x",
            "-n",
            "2",
            "--batch-size",
            "16",
            "--ubatch-size",
            "8",
            "--ctx-size",
            "64",
        ][..],
        &["run", "-p", "x", "-n", "2", "-sys", "Be brief."][..],
        &["run", "-p", "x", "-n", "2", "--system-prompt", "Be brief."][..],
        // Until the end of the context, as llama.cpp's -n -1.
        &["run", "-p", "x", "-n", "-1", "-c", "24", "--raw"][..],
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", log(&o));
    }
}

#[test]
fn check_without_nvrtc_stops_before_compiling_and_writes_nothing() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("report");
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args(["check", "softcap", "--compile-only", "--out"])
        .arg(&out)
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap();
    if o.status.code() == Some(0) {
        // NVRTC is a system library on this host: the missing case cannot
        // be staged, and the compile must then have worked.
        assert!(out.join("check.csv").is_file(), "{}", log(&o));
        println!("NVRTC is in the system library path here; checked the present case");
        return;
    }
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("pip install nvidia-cuda-nvrtc") && err.contains("LD_LIBRARY_PATH"),
        "{}",
        log(&o)
    );
    assert_eq!(err.matches("error:").count(), 1, "one message: {}", log(&o));
    assert!(!out.exists(), "no report folder without NVRTC");
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .args(["tune", "softcap"])
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    assert!(
        text(&o.stderr).contains("pip install nvidia-cuda-nvrtc"),
        "{}",
        log(&o)
    );
}

#[test]
fn arch_is_checked_against_nvrtc_and_compile_only_notes_name_the_target() {
    require_nvrtc();
    let d = tempfile::tempdir().unwrap();
    let o = gemtune(&["check", "softcap", "--compile-only", "--arch", "sm_91"]);
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("sm_90") && err.contains("sm_90a") && err.contains("sm_80"),
        "{}",
        log(&o)
    );
    let o = gemtune(&["check", "softcap", "--compile-only", "--arch", "hopper"]);
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    for arch in ["sm_90a", "sm_90", "sm_89"] {
        let out = d.path().join(arch);
        let o = gemtune(&[
            "check",
            "softcap",
            "gemm_wgmma",
            "--compile-only",
            "--arch",
            arch,
            "--shape",
            "e4b.ffn_up",
            "--shape",
            "softcap.edge",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{arch}: {}", log(&o));
        let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
        assert!(!all.contains("this device"), "{arch}: {all}");
        if arch == "sm_89" {
            assert!(all.contains("the target is sm_89"), "{all}");
        }
    }
}

#[test]
fn unknown_family_and_directory_model_get_clear_messages() {
    let o = gemtune(&["check", "nosuch", "--compile-only"]);
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("unknown family `nosuch`")
            && err.contains("gemv")
            && err.contains("attn_prefill"),
        "{}",
        log(&o)
    );
    let d = tempfile::tempdir().unwrap();
    let o = gemtune(&["run", "-p", "x", "-m", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains("is a directory, not a GGUF file"),
        "{}",
        log(&o)
    );
    assert_eq!(
        err.matches(d.path().to_str().unwrap()).count(),
        1,
        "the path once: {err}"
    );
}

/// `check --compile-only` without `--out`, run from a directory inside the
/// checkout, writes under the ignored scratch directory: the working
/// directory stays empty and `git status` does not change.
#[test]
fn default_reports_leave_the_checkout_clean() {
    require_nvrtc();
    let root = common::repo_root();
    let status = || {
        let o = std::process::Command::new("git")
            .current_dir(&root)
            .args(["status", "--porcelain", "--untracked-files=all"])
            .output()
            .expect("git");
        assert!(o.status.success(), "git status: {}", text(&o.stderr));
        text(&o.stdout)
    };
    let cwd = tempfile::Builder::new()
        .prefix("cli-contract-")
        .tempdir_in(root.join("harness"))
        .unwrap();
    let before = status();
    let o = gemtune_in(
        cwd.path(),
        &[
            "check",
            "softcap",
            "--compile-only",
            "--shape",
            "softcap.edge",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    assert!(
        text(&o.stderr).contains("target/gemtune/check-"),
        "the default location is printed: {}",
        log(&o)
    );
    let left: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(
        left.is_empty(),
        "check wrote into its working directory: {left:?}"
    );
    let after = status();
    assert_eq!(before, after, "git status changed");
}

/// Negative input reaches each flag's own range check: never clap's
/// "unexpected argument '-0'" nor "invalid digit".
#[test]
fn negative_values_get_the_flags_range_message() {
    for (args, flag, range) in [
        (
            &[
                "ab",
                "--baseline",
                "a",
                "--candidate",
                "b",
                "--min-effect",
                "-0.1",
            ][..],
            "--min-effect",
            "(0, 0.5)",
        ),
        (
            &[
                "report",
                "--baseline",
                "a.csv",
                "--current",
                "b.csv",
                "--floor",
                "-1",
            ][..],
            "--floor",
            "[0, 1)",
        ),
        (
            &["tune", "softcap", "--budget-ms", "-1"][..],
            "--budget-ms",
            "a finite number > 0",
        ),
        (
            &["run", "-p", "x", "--top-k", "-3"][..],
            "--top-k",
            "an integer >= 0",
        ),
        (
            &["run", "-p", "x", "-s", "-1"][..],
            "--seed",
            "an integer from 0 to 18446744073709551615",
        ),
        (
            &["bench", "-r", "-2"][..],
            "--repetitions",
            "an integer >= 1",
        ),
        (
            &["ab", "--baseline", "a", "--candidate", "b", "--reps", "-8"][..],
            "--reps",
            "an even number",
        ),
    ] {
        let o = gemtune(args);
        assert_eq!(o.status.code(), Some(4), "{args:?}: {}", log(&o));
        let err = text(&o.stderr);
        assert!(
            err.contains(flag) && err.contains(range),
            "{args:?}: wanted {flag} and `{range}`: {}",
            log(&o)
        );
        assert!(
            !err.contains("unexpected argument") && !err.contains("invalid digit"),
            "{args:?}: {}",
            log(&o)
        );
    }
}

/// A misspelt key in a shapes file is the key the error names.
#[test]
fn a_shapes_file_typo_names_the_wrong_key() {
    require_nvrtc();
    let d = tempfile::tempdir().unwrap();
    let shapes = d.path().join("typo.toml");
    std::fs::write(
        &shapes,
        "[tokens]\nN = [1, 8]\n\n[shapes]\nsoftcap.x = { m = \"N\", widht = 128 }\n",
    )
    .unwrap();
    let o = gemtune(&[
        "check",
        "softcap",
        "--compile-only",
        "--shapes",
        shapes.to_str().unwrap(),
        "--out",
        d.path().join("out").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(4), "{}", log(&o));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!("{}:5:", shapes.display()))
            && err.contains("unknown key `widht`")
            && err.contains("did you mean `width`?"),
        "{}",
        log(&o)
    );
    assert!(!err.contains("unknown key `m`"), "{}", log(&o));
}

/// `--arch sm_90a` is what the rows record and the progress prints.
#[test]
fn the_arch_asked_for_is_the_arch_recorded() {
    require_nvrtc();
    let d = tempfile::tempdir().unwrap();
    for arch in ["sm_90a", "sm_90"] {
        let out = d.path().join(arch);
        let o = gemtune(&[
            "check",
            "softcap",
            "--compile-only",
            "--arch",
            arch,
            "--shape",
            "softcap.edge",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{arch}: {}", log(&o));
        assert!(
            text(&o.stderr).contains(&format!("define sets to compile for {arch}\n")),
            "{arch}: {}",
            log(&o)
        );
        let rows: Vec<gemtune::results::CheckRow> =
            gemtune::results::read_csv(&out.join("check.csv")).expect("check.csv");
        assert!(!rows.is_empty());
        for r in rows {
            assert_eq!(r.arch, arch, "{r:?}");
        }
    }
}

/// The main command's first line says which backend runs which model, and
/// what the built-in model's weights are; so does `run`'s.
#[test]
fn the_main_commands_first_line_names_backend_and_model() {
    // `--budget-s 0`: the compile report stops at once (its first line is
    // what is under test, not its compiles).
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .env("CUDA_VISIBLE_DEVICES", "")
        .args(["demo", "-n", "2", "--budget-s", "0"])
        .output()
        .unwrap();
    let err = text(&o.stderr);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("demo: no GPU found: NVRTC compiles every kernel variant for sm_90")
            && first.contains("the CPU engine runs the built-in demo model")
            && first.contains("trained on a few pages of English prose"),
        "{}",
        log(&o)
    );
    let o = common::gemtune()
        .current_dir(common::repo_root())
        .env("CUDA_VISIBLE_DEVICES", "")
        .args(["run", "-p", "Hello", "-n", "2"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let err = text(&o.stderr);
    let first = err.lines().next().unwrap_or_default();
    assert!(
        first.starts_with("run: the CPU engine (--backend auto found no GPU")
            && first.contains("model: built-in demo model")
            && first.contains("trained on a few pages of English prose"),
        "{}",
        log(&o)
    );
    let d = tempfile::tempdir().unwrap();
    let m = d.path().join("tiny.gguf");
    let o = gemtune(&["synth", "tiny", "q8_0", m.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let o = gemtune(&[
        "run",
        "-p",
        "Hello",
        "-n",
        "2",
        "--backend",
        "cpu",
        "-m",
        m.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", log(&o));
    let first = text(&o.stderr)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    assert!(
        first.starts_with("run: the CPU engine | model: ")
            && first.contains(m.to_str().unwrap())
            && !first.contains("random"),
        "{}",
        log(&o)
    );
}
