//! `gemtune ab`: an interleaved end-to-end A/B of two engine arms.
//!
//! Each arm runs as a persistent worker process (`BIN bench --worker ...`,
//! `protocol` has the JSON-lines protocol) so the model loads once and the
//! arms alternate cheaply. An arm is
//! - a profile: a bare name in `variants/profiles/` (`main`) or a path to a
//!   profile `.toml`, served by this gemtune binary (or `--worker BIN`);
//! - `git:REF`: that revision built in a temporary worktree and cached by
//!   commit under `target/gemtune/ab-builds/<sha>/` (`build`);
//! - a path to another gemtune binary.
//!
//! The run: both workers start (and load) side by side; the numerics gate
//! compares their logits over a fixed prompt set (`gate`) and stops the run
//! with exit 3 on a divergence; then warm-up reps (discarded) and ABBA
//! blocks of timed reps (`session`), judged per test by
//! `crate::verdict`; `summary` writes the report.

pub mod build;
pub mod gate;
pub mod protocol;
pub mod session;
pub mod summary;
pub mod worker;

use std::path::{Path, PathBuf};
use thiserror::Error;

/// Everything that stops an A/B run short of a verdict. All of them are
/// infrastructure or input errors (exit 4); a failed numerics gate is an
/// outcome, not an error.
#[derive(Debug, Error)]
pub enum AbError {
    #[error("bad arm '{arm}': {msg}")]
    BadArm { arm: String, msg: String },
    #[error("{msg}")]
    BadInput { msg: String },
    #[error("git:{reference}: {msg}")]
    Build { reference: String, msg: String },
    #[error("{arm} worker ({bin}): {msg}{}", tail_text(.stderr_tail))]
    Worker {
        arm: String,
        bin: String,
        msg: String,
        stderr_tail: Vec<String>,
    },
    #[error("{path}: {msg}")]
    Io { path: PathBuf, msg: String },
}

fn tail_text(t: &[String]) -> String {
    if t.is_empty() {
        "\n(the worker wrote nothing to stderr)".to_string()
    } else {
        format!(
            "\nlast {} lines of the worker's stderr:\n  {}",
            t.len(),
            t.join("\n  ")
        )
    }
}

/// How an arm was given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArmSpec {
    /// A profile name in `<variants>/profiles/` (resolved to its file).
    Profile { name: String, path: PathBuf },
    /// A profile file given by path.
    ProfileFile(PathBuf),
    /// `git:REF`.
    Git(String),
    /// Another gemtune binary.
    Binary(PathBuf),
}

/// The profile names available in `<variants>/profiles/`.
pub fn available_profiles(variants: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(variants.join("profiles"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let p = e.path();
            (p.extension().is_some_and(|x| x == "toml"))
                .then(|| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
                .flatten()
        })
        .collect();
    v.sort();
    v
}

/// Parses an arm: `git:REF`; a path (it holds a '/' or ends in `.toml`):
/// a profile file when it ends in `.toml`, otherwise an executable; a bare
/// name: a profile in `<variants>/profiles/`, which must exist.
pub fn parse_arm(s: &str, variants: &Path) -> Result<ArmSpec, AbError> {
    let bad = |msg: String| AbError::BadArm {
        arm: s.to_string(),
        msg,
    };
    if let Some(r) = s.strip_prefix("git:") {
        if r.trim().is_empty() {
            return Err(bad(
                "git: needs a revision, e.g. git:main or git:HEAD~1".into()
            ));
        }
        return Ok(ArmSpec::Git(r.to_string()));
    }
    if s.is_empty() {
        return Err(bad("empty".into()));
    }
    if s.contains('/') || s.ends_with(".toml") {
        let p = PathBuf::from(s);
        if !p.is_file() {
            return Err(bad(format!("no such file {}", p.display())));
        }
        if s.ends_with(".toml") {
            return Ok(ArmSpec::ProfileFile(p));
        }
        if !is_executable(&p) {
            return Err(bad(format!(
                "{} is not executable (a gemtune binary was expected)",
                p.display()
            )));
        }
        return Ok(ArmSpec::Binary(p));
    }
    let path = variants.join("profiles").join(format!("{s}.toml"));
    if !path.is_file() {
        let avail = available_profiles(variants);
        return Err(bad(format!(
            "no profile {} ({}); a bare name is a profile, git:{s} is a revision, ./{s} a binary",
            path.display(),
            if avail.is_empty() {
                "the folder has no profiles yet".to_string()
            } else {
                format!("available: {}", avail.join(", "))
            }
        )));
    }
    Ok(ArmSpec::Profile {
        name: s.to_string(),
        path,
    })
}

#[cfg(unix)]
fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(p: &Path) -> bool {
    p.is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arms_parse_by_form() {
        let d = std::env::temp_dir().join(format!("gemtune-arms-{}", std::process::id()));
        std::fs::create_dir_all(d.join("profiles")).unwrap();
        std::fs::write(d.join("profiles/main.toml"), "").unwrap();
        assert!(matches!(parse_arm("main", &d), Ok(ArmSpec::Profile { .. })));
        assert_eq!(
            parse_arm("git:main", &d).unwrap(),
            ArmSpec::Git("main".into())
        );
        let prof = d.join("profiles/main.toml");
        assert_eq!(
            parse_arm(prof.to_str().unwrap(), &d).unwrap(),
            ArmSpec::ProfileFile(prof.clone())
        );
        let e = parse_arm("flash-swa", &d).unwrap_err().to_string();
        assert!(e.contains("available: main"), "{e}");
        assert!(parse_arm("git:", &d).is_err());
        assert!(parse_arm("", &d).is_err());
        assert!(parse_arm("./missing-binary", &d).is_err());
        // A file that is not executable is not a binary arm.
        let f = d.join("not-exec");
        std::fs::write(&f, "").unwrap();
        let e = parse_arm(f.to_str().unwrap(), &d).unwrap_err().to_string();
        assert!(e.contains("not executable"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
