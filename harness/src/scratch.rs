//! Where a command writes when no `--out` is given: the scratch directory
//! `target/gemtune/` of the checkout, found by walking up from the current
//! directory to the first one holding `variants/` (as `spec::variants_dir`
//! finds the specs), or of the current directory when there is none.
//!
//! Local to `ab` and `report` for now; the CLI-contract work adds a shared
//! helper for every subcommand's default output location, and this one
//! should be folded into it.

use std::path::{Path, PathBuf};

/// The checkout root: the first ancestor of the current directory that
/// holds `variants/`, else the current directory.
pub fn checkout_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    root_from(&cwd)
}

/// `checkout_root` starting from `dir`.
pub fn root_from(dir: &Path) -> PathBuf {
    let mut d = dir.to_path_buf();
    loop {
        if d.join("variants").is_dir() {
            return d;
        }
        if !d.pop() {
            return dir.to_path_buf();
        }
    }
}

/// `<checkout>/target/gemtune`.
pub fn scratch_dir() -> PathBuf {
    checkout_root().join("target").join("gemtune")
}

/// `<scratch>/<name>-<UTC timestamp>`: a fresh default output directory.
pub fn default_out(name: &str) -> PathBuf {
    scratch_dir().join(format!("{name}-{}", crate::util::timestamp()))
}
