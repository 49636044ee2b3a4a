//! Where the end-to-end tests find the `gemtune` binary and the repository:
//! where cargo built them, or in a staged copy on a GPU host (the staged
//! suite runs from the checkout root with the binary on PATH).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Output;

/// The binary cargo built, or `gemtune` from PATH when that path does not
/// exist on this machine.
pub fn gemtune_bin() -> PathBuf {
    let built = PathBuf::from(env!("CARGO_BIN_EXE_gemtune"));
    if built.exists() {
        built
    } else {
        PathBuf::from("gemtune")
    }
}

/// A `gemtune` command whose cubin cache is the tests' own
/// (`target/gemtune/test-cubin` of the checkout), never the user's: tests
/// neither read stale entries a user left nor fill the user's cache.
/// `scripts/compile-report.sh` reads the same directory, so its compiles
/// hit what the compile gate just built.
pub fn gemtune() -> std::process::Command {
    let mut c = std::process::Command::new(gemtune_bin());
    c.env("GEMTUNE_CACHE_DIR", test_cache_dir());
    c
}

/// `target/gemtune/test-cubin` of the checkout.
pub fn test_cache_dir() -> PathBuf {
    repo_root()
        .join("target")
        .join("gemtune")
        .join("test-cubin")
}

/// The repository root (the directory holding `variants/`).
pub fn repo_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("variants").is_dir() {
        built
    } else {
        std::env::current_dir().expect("current directory")
    }
}

/// Bytes a child printed, as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A child's exit status and both streams, for assertion messages.
pub fn log(o: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        o.status.code(),
        text(&o.stdout),
        text(&o.stderr)
    )
}
