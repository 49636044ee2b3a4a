//! Where the end-to-end tests find the `gemtune` binary and the repository:
//! where cargo built them, or in a staged copy on a GPU host (the staged
//! suite runs from the checkout root with the binary on PATH).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

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

/// The repository root (the directory holding `variants/`).
pub fn repo_root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    if built.join("variants").is_dir() {
        built
    } else {
        std::env::current_dir().expect("current directory")
    }
}
