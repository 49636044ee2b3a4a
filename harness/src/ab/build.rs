//! `git:REF` arms: the revision built in a temporary worktree, cached by
//! commit.
//!
//! 1. REF is resolved to a commit in the checkout's repository
//!    (`git rev-parse --verify REF^{commit}`).
//! 2. `<scratch>/ab-builds/<sha>/gemtune` is the cache entry; when it
//!    exists it is used as is.
//! 3. Otherwise `git worktree add --detach` checks the commit out under
//!    `<scratch>/ab-builds/<sha>.src-<pid>`, the build command runs there
//!    (`sh -c`, log in `<scratch>/ab-builds/<sha>.log`), its binary is
//!    moved into the cache entry (a rename: a failed or interrupted build
//!    leaves no entry), and the worktree is removed.
//!
//! The build command is `DEFAULT_BUILD_CMD` unless `GEMTUNE_AB_BUILD_CMD`
//! sets another. It runs with `GEMTUNE_AB_OUT` (where the binary must be
//! written), `GEMTUNE_AB_SHA` and `CARGO_TARGET_DIR` set; the cargo target
//! directory `<scratch>/ab-builds/target` is shared by every revision, so a
//! second revision rebuilds only what changed.

use super::AbError;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Environment variable that replaces the build command.
pub const BUILD_CMD_ENV: &str = "GEMTUNE_AB_BUILD_CMD";

/// The default build: a release build of the gemtune binary, copied out.
pub const DEFAULT_BUILD_CMD: &str = r#"cargo build --release --locked -p gemtune && cp "$CARGO_TARGET_DIR/release/gemtune" "$GEMTUNE_AB_OUT""#;

/// A built (or cached) revision.
#[derive(Clone, Debug, PartialEq)]
pub struct GitBuild {
    pub reference: String,
    pub sha: String,
    pub bin: PathBuf,
    /// Found in the cache (no build ran).
    pub cached: bool,
    /// Build time, s (0 when cached).
    pub seconds: f64,
    pub log: Option<PathBuf>,
}

fn err(reference: &str, msg: impl Into<String>) -> AbError {
    AbError::Build {
        reference: reference.to_string(),
        msg: msg.into(),
    }
}

fn git(repo: &Path, args: &[&str]) -> Result<String, String> {
    let o = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// The commit REF names in `repo`.
pub fn resolve(repo: &Path, reference: &str) -> Result<String, AbError> {
    git(repo, &["rev-parse", "--show-toplevel"]).map_err(|e| {
        err(
            reference,
            format!("{} is not in a git repository: {e}", repo.display()),
        )
    })?;
    git(
        repo,
        &[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("{reference}^{{commit}}"),
        ],
    )
    .map_err(|_| err(reference, format!("no such commit in {}", repo.display())))
}

/// The cache entry of a commit.
pub fn cached_bin(scratch: &Path, sha: &str) -> PathBuf {
    scratch.join("ab-builds").join(sha).join("gemtune")
}

/// Builds (or finds in the cache) the gemtune binary of `reference`.
/// `progress` gets one line per step.
pub fn build(
    repo: &Path,
    reference: &str,
    scratch: &Path,
    mut progress: impl FnMut(&str),
) -> Result<GitBuild, AbError> {
    let sha = resolve(repo, reference)?;
    let bin = cached_bin(scratch, &sha);
    if bin.is_file() {
        progress(&format!(
            "git:{reference} = {}: cached {}",
            &sha[..12.min(sha.len())],
            bin.display()
        ));
        return Ok(GitBuild {
            reference: reference.to_string(),
            sha,
            bin,
            cached: true,
            seconds: 0.0,
            log: None,
        });
    }
    let root = scratch.join("ab-builds");
    let entry = root.join(&sha);
    std::fs::create_dir_all(&entry).map_err(|e| {
        err(
            reference,
            format!("{}: cannot create: {e}", entry.display()),
        )
    })?;
    let pid = std::process::id();
    let wt = root.join(format!("{sha}.src-{pid}"));
    let partial = entry.join(format!("gemtune.partial-{pid}"));
    let log = root.join(format!("{sha}.log"));
    let target = root.join("target");
    if wt.exists() {
        remove_worktree(repo, &wt);
    }
    // Worktrees of interrupted builds (their directories already removed).
    let _ = git(repo, &["worktree", "prune"]);
    let _tracked = [
        crate::interrupt::track_temp(wt.clone()),
        crate::interrupt::track_temp(partial.clone()),
    ];
    git(
        repo,
        &[
            "worktree",
            "add",
            "--detach",
            "--force",
            &wt.to_string_lossy(),
            &sha,
        ],
    )
    .map_err(|e| err(reference, e))?;
    let cmd = std::env::var(BUILD_CMD_ENV)
        .ok()
        .filter(|c| !c.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_BUILD_CMD.to_string());
    progress(&format!(
        "git:{reference} = {}: building in {} (log {}): {cmd}",
        &sha[..12.min(sha.len())],
        wt.display(),
        log.display()
    ));
    let t0 = Instant::now();
    let result = (|| {
        let logf = std::fs::File::create(&log)
            .map_err(|e| format!("{}: cannot create: {e}", log.display()))?;
        let logf2 = logf
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        // Its own process group, so an interrupt stops the compilers too.
        let (mut child, _tracked) = crate::interrupt::spawn_group(
            Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .current_dir(&wt)
                .env("GEMTUNE_AB_OUT", &partial)
                .env("GEMTUNE_AB_SHA", &sha)
                .env("CARGO_TARGET_DIR", &target)
                .stdin(Stdio::null())
                .stdout(logf)
                .stderr(logf2),
        )
        .map_err(|e| format!("cannot run sh: {e}"))?;
        let status = child
            .wait()
            .map_err(|e| format!("waiting for the build: {e}"))?;
        if !status.success() {
            return Err(format!(
                "the build exited with {status}; last lines of {}:\n  {}",
                log.display(),
                log_tail(&log, 20).join("\n  ")
            ));
        }
        if !partial.is_file() {
            return Err(format!(
                "the build succeeded but wrote no binary to $GEMTUNE_AB_OUT ({})",
                partial.display()
            ));
        }
        make_executable(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
        std::fs::rename(&partial, &bin)
            .map_err(|e| format!("{} -> {}: {e}", partial.display(), bin.display()))
    })();
    remove_worktree(repo, &wt);
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result.map_err(|e| err(reference, e))?;
    let seconds = t0.elapsed().as_secs_f64();
    progress(&format!(
        "git:{reference}: built in {seconds:.1} s -> {}",
        bin.display()
    ));
    Ok(GitBuild {
        reference: reference.to_string(),
        sha,
        bin,
        cached: false,
        seconds,
        log: Some(log),
    })
}

fn remove_worktree(repo: &Path, wt: &Path) {
    if git(
        repo,
        &["worktree", "remove", "--force", &wt.to_string_lossy()],
    )
    .is_err()
    {
        let _ = std::fs::remove_dir_all(wt);
        let _ = git(repo, &["worktree", "prune"]);
    }
}

fn log_tail(p: &Path, n: usize) -> Vec<String> {
    let text = std::fs::read_to_string(p).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|s| s.to_string())
        .collect()
}

#[cfg(unix)]
fn make_executable(p: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(perm.mode() | 0o755);
    std::fs::set_permissions(p, perm)
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> std::io::Result<()> {
    Ok(())
}
