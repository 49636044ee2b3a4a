//! The shell scripts find the binary where cargo puts it (CARGO_TARGET_DIR
//! honoured), and CI keeps every cache it fills under the checkout's
//! `target/`.

mod common;

use std::path::Path;
use std::process::Command;

fn scripts() -> Vec<std::path::PathBuf> {
    let root = common::repo_root();
    let mut v: Vec<_> = std::fs::read_dir(root.join("scripts"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sh"))
        .collect();
    v.push(root.join(".ci/run"));
    v.sort();
    v
}

#[test]
fn the_binary_is_found_under_cargo_target_dir() {
    let root = common::repo_root();
    let elsewhere = tempfile::tempdir().unwrap();
    for (flags, profile) in [(&[][..], "debug"), (&["--release"][..], "release")] {
        let o = Command::new("bash")
            .arg(root.join("scripts/gemtune-bin.sh"))
            .args(flags)
            .arg("--no-build")
            .env("CARGO_TARGET_DIR", elsewhere.path())
            .env_remove("GEMTUNE")
            .output()
            .expect("bash");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let printed = String::from_utf8_lossy(&o.stdout).trim().to_string();
        assert_eq!(
            Path::new(&printed),
            elsewhere.path().join(profile).join("gemtune"),
            "{flags:?}"
        );
    }
    // GEMTUNE names the binary outright.
    let o = Command::new("bash")
        .arg(root.join("scripts/gemtune-bin.sh"))
        .env("GEMTUNE", "/opt/gemtune")
        .output()
        .expect("bash");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "/opt/gemtune");
}

/// No script names a path inside cargo's target directory itself: every
/// one asks scripts/gemtune-bin.sh (the scratch `target/gemtune/` of the
/// checkout is not cargo's and stays where it is).
#[test]
fn no_script_hard_codes_cargos_build_directories() {
    for p in scripts() {
        let text = std::fs::read_to_string(&p).unwrap();
        for (i, l) in text.lines().enumerate() {
            let code = l.split('#').next().unwrap_or("");
            for bad in ["target/debug", "target/release"] {
                assert!(
                    !code.contains(bad),
                    "{}:{}: `{bad}` (use scripts/gemtune-bin.sh): {l}",
                    p.display(),
                    i + 1
                );
            }
        }
    }
}

/// CI's caches: the user's cache directory is redirected into target/, and
/// the newest-NVRTC gate keeps its cubins (and no pip cache) there too.
#[test]
fn ci_writes_its_caches_under_target() {
    let root = common::repo_root();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let xdg = ci
        .lines()
        .find(|l| l.trim_start().starts_with("export XDG_CACHE_HOME="))
        .expect(".ci/run exports XDG_CACHE_HOME");
    assert!(xdg.contains("\"$PWD/target/"), "{xdg}");
    let gate = std::fs::read_to_string(root.join("scripts/nvrtc-newest-gate.sh")).unwrap();
    assert!(
        gate.contains("export GEMTUNE_CACHE_DIR=$PWD/target/"),
        "the newest-NVRTC gate's cubin cache"
    );
    assert!(gate.contains("--no-cache-dir"), "pip keeps no cache");
    let report = std::fs::read_to_string(root.join("scripts/compile-report.sh")).unwrap();
    assert!(
        report.contains("GEMTUNE_CACHE_DIR=${GEMTUNE_CACHE_DIR:-$PWD/target/"),
        "the compile report's cubin cache"
    );
}
