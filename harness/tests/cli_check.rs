//! `gemtune check` end to end through the binary. The compile gate here
//! compiles every family's baseline variant for sm_80, sm_89 and sm_90 with
//! NVRTC through `check --compile-only` (no GPU; it fails loudly when NVRTC
//! cannot be loaded) and holds the rows to the gate's rules. The gate of
//! every variant of every family, the same command without `--variant`, is
//! CI's compile report (`scripts/compile-report.sh`): it fails on a compile
//! error, a forbidden spill or a row that changed or vanished against
//! `reports/baseline/compile.csv`, and running it here too took most of the
//! test suite's time.

mod common;

use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    common::repo_root()
}

fn require_nvrtc() {
    assert!(
        gemtune_kernels::compile::nvrtc_available(),
        "NVRTC could not be loaded: install it (pip install nvidia-cuda-nvrtc==13.0.88) and put its \
         lib directory (python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], \"cu13\", \"lib\"))') \
         on LD_LIBRARY_PATH; the compile gate cannot run without it"
    );
}

fn compile_gate(arch: &str) {
    require_nvrtc();
    let out = tempfile::tempdir().unwrap();
    let o = common::gemtune()
        .current_dir(repo())
        .args([
            "check",
            "--compile-only",
            "--variant",
            "baseline",
            "--arch",
            arch,
        ])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run gemtune");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    let bad: Vec<&str> = stdout
        .lines()
        .filter(|l| l.contains(" compile-error ") || l.contains(" spills "))
        .collect();
    assert!(
        o.status.code() == Some(0) && bad.is_empty(),
        "gemtune check --compile-only --arch {arch} exited {:?}\nfailing rows:\n{}\nstderr:\n{stderr}",
        o.status.code(),
        bad.join("\n")
    );
    let rows: Vec<gemtune::results::CheckRow> =
        gemtune::results::read_csv(&out.path().join("check.csv")).expect("check.csv");
    let target: gemtune_kernels::compile::Arch = arch.parse().expect("arch");
    for f in gemtune_kernels::family::families() {
        if let Some(only) = f.arch_specific().filter(|a| *a != target) {
            // The baseline is rejected with the reason, never compiled.
            let mine: Vec<_> = rows.iter().filter(|r| r.family == f.name()).collect();
            assert!(!mine.is_empty(), "no rows for {} on {arch}", f.name());
            for r in mine {
                assert!(
                    r.verdict == "rejected" || r.verdict == "duplicate",
                    "{} on {arch} (needs {only}a): {} {}",
                    f.name(),
                    r.verdict,
                    r.reason
                );
            }
            continue;
        }
        let compiled = rows
            .iter()
            .filter(|r| r.family == f.name() && r.verdict == "compiled")
            .count();
        assert!(compiled > 0, "no compiled rows for {} on {arch}", f.name());
        let base = rows
            .iter()
            .find(|r| r.family == f.name() && r.variant == "baseline" && r.verdict == "compiled")
            .unwrap_or_else(|| panic!("{} baseline not compiled on {arch}", f.name()));
        assert!(
            base.registers.unwrap_or(0) > 0,
            "registers recorded for {}",
            f.name()
        );
        assert_eq!(base.arch, arch);
    }
}

#[test]
fn compile_gate_sm_80() {
    compile_gate("sm_80");
}

#[test]
fn compile_gate_sm_89() {
    compile_gate("sm_89");
}

#[test]
fn compile_gate_sm_90() {
    compile_gate("sm_90");
}

fn copy_dir(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &dst.join(e.file_name()));
        } else {
            std::fs::copy(&p, dst.join(e.file_name())).unwrap();
        }
    }
}

fn run_check(vdir: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = tempfile::tempdir().unwrap();
    let o = common::gemtune()
        .args(["check", "--compile-only", "--variants-dir"])
        .arg(vdir)
        .args(["--out"])
        .arg(out.path())
        .args(extra)
        .output()
        .expect("run gemtune");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn bad_specs_exit_4_naming_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let vdir = tmp.path().join("variants");
    copy_dir(&repo().join("variants"), &vdir);
    let spec = vdir.join("quantize_q8_1.toml");
    let text = std::fs::read_to_string(&spec).unwrap();
    let line_of =
        |needle: &str, t: &str| t.lines().position(|l| l.starts_with(needle)).unwrap() + 1;

    let bad = text.replace(
        "forbid_spills = true",
        "forbid_spills = true\nspeed = \"fast\"",
    );
    std::fs::write(&spec, &bad).unwrap();
    let (code, err) = run_check(&vdir, &["quantize_q8_1"]);
    assert_eq!(code, Some(4), "{err}");
    let want = format!(
        "quantize_q8_1.toml:{}:1: unknown key `speed` in [kernel]",
        line_of("speed", &bad)
    );
    assert!(err.contains(&want), "wanted `{want}` in:\n{err}");

    let bad = text.replace("THREADS = 256", "THREADS = 256\nVEC = 4");
    std::fs::write(&spec, &bad).unwrap();
    let (code, err) = run_check(&vdir, &["quantize_q8_1"]);
    assert_eq!(code, Some(4), "{err}");
    let want = format!(
        "quantize_q8_1.toml:{}:1: define VEC is not declared in quantize_q8_1.cu's Defines: block",
        line_of("VEC", &bad)
    );
    assert!(err.contains(&want), "wanted `{want}` in:\n{err}");

    std::fs::write(&spec, &text).unwrap();
    let (code, err) = run_check(&vdir, &["quantize_q8_1", "--shapes", "nonexistent.toml"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("nonexistent.toml: cannot read"), "{err}");
    let (code, err) = run_check(&vdir, &["no_such_family"]);
    assert_eq!(code, Some(4), "{err}");
    assert!(err.contains("unknown family `no_such_family`"), "{err}");
    assert!(err.contains("the families are "), "{err}");
}

/// `gemtune check` on the GPU over every family: a real E4B shape and the
/// partial-tile edge shapes at odd token counts (the larger E4B/12B shapes are
/// in scripts/gpu-tune.sh's check phase, too slow for the f64 oracle in a
/// test). Fails loudly without a GPU.
#[test]
#[ignore = "needs a CUDA GPU"]
fn check_every_family_on_the_gpu() {
    require_nvrtc();
    let out = tempfile::tempdir().unwrap();
    let o = common::gemtune()
        .current_dir(repo())
        .args(["check", "--tokens", "1,3,7,8,113", "--shape", "e4b.attn_k"])
        // Every family needs a shape past the filters: attention and RoPE
        // (attn_check.toml), the row-wise families (rows_check.toml), the
        // activation conversion (convert.toml), the MoE families (moe.toml),
        // and the partial-tile edges.
        .args([
            "--shape",
            "e4b.swa",
            "--shape",
            "rmsnorm.e4b",
            "--shape",
            "gelu_mul.e4b",
        ])
        .args([
            "--shape",
            "embed.q",
            "--shape",
            "ple.q8",
            "--shape",
            "softcap.vocab",
        ])
        // The MoE families: the tiny MoE (tokens share experts).
        .args(["--shape", "moe_route.tiny", "--shape", "moe_gemv.tiny"])
        .args(["--shape", "e4b.d_model", "--shape", "edge.", "--out"])
        .arg(out.path())
        .output()
        .expect("run gemtune");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(0),
        "gemtune check failed (exit 4 with 'no CUDA GPU' means this host has no GPU):\n{}\n{stderr}",
        stdout
            .lines()
            .filter(|l| !l.contains(" pass ") && !l.contains(" rejected ") && !l.contains(" duplicate "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let rows: Vec<gemtune::results::CheckRow> =
        gemtune::results::read_csv(&out.path().join("check.csv")).expect("check.csv");
    for f in gemtune_kernels::family::families() {
        assert!(
            rows.iter()
                .any(|r| r.family == f.name() && r.verdict == "pass"),
            "no passing cell for {}",
            f.name()
        );
    }
}
