//! Where a command writes what nobody asked to keep (default report
//! folders, bench's synthetic model): the scratch directory. Inside a
//! checkout (found by walking up from the current directory to the first
//! one holding `variants/`, as `spec::variants_dir` finds the specs) it is
//! the checkout's `target/gemtune/`, which git ignores; elsewhere it is
//! `$XDG_CACHE_HOME/gemtune` (or `~/.cache/gemtune`). `reports/` holds only
//! what is committed, written there with an explicit `--out`.

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

/// `<checkout>/target/gemtune`, or the user's cache directory outside a
/// checkout.
pub fn scratch_dir() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    if root_from(&cwd).join("variants").is_dir() {
        return root_from(&cwd).join("target").join("gemtune");
    }
    std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir)
        .join("gemtune")
}

/// `<scratch>/<name>-<UTC timestamp>`: a fresh default output directory.
pub fn default_out(name: &str) -> PathBuf {
    scratch_dir().join(format!("{name}-{}", crate::util::timestamp()))
}
