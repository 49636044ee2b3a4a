//! SIGINT and SIGTERM for the commands that run long (`ab`, `tune`,
//! `bench`): what they started stops and what they wrote only for
//! themselves goes away, while finished results stay.
//!
//! A command registers each child process it starts (`track_child`) and
//! each temporary file or directory (`track_temp`) for as long as it owns
//! them; the returned guard unregisters on drop. On a signal, the handler
//! thread (the `ctrlc` crate's, not a signal context) kills every tracked
//! child's process group and reaps it, removes every tracked path, and
//! exits with `INTERRUPTED`.
//!
//! Children are started as leaders of their own process group (`spawn_group`):
//! a terminal's Ctrl-C then reaches only this process, which stops them in
//! order, and killing the group also stops what a child started (a build's
//! compilers).
//!
//! `tune` asks for `Mode::Finish`: the first signal only sets the flag
//! (`requested`), its loop stops after the current measurement and writes
//! its report; a second signal exits as above.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The exit status after a signal (128 + SIGINT, as a shell reports it;
/// SIGTERM exits the same way: the handler cannot tell them apart).
pub const INTERRUPTED: u8 = 130;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Stop children, remove temporary files, exit.
    Exit,
    /// First signal: set the flag for the command's loop; second: `Exit`.
    Finish,
}

struct Registry {
    next: usize,
    children: Vec<(usize, u32)>,
    temps: Vec<(usize, PathBuf)>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    children: Vec::new(),
    temps: Vec::new(),
});
static REQUESTED: AtomicBool = AtomicBool::new(false);
/// Set once the handler has begun to stop everything and exit.
static EXITING: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();

fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

/// Installs the handler (once per process; later calls keep the first
/// mode). An error means signals keep their default action.
pub fn install(mode: Mode) -> Result<(), String> {
    INSTALLED
        .get_or_init(|| {
            ctrlc::set_handler(move || on_signal(mode))
                .map_err(|e| format!("cannot handle SIGINT/SIGTERM: {e}"))
        })
        .clone()
}

/// Whether a signal arrived (`Mode::Finish` commands poll this).
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The flag `requested` reads, for code that takes an `AtomicBool`.
pub fn flag() -> &'static AtomicBool {
    &REQUESTED
}

fn on_signal(mode: Mode) {
    REQUESTED.store(true, Ordering::SeqCst);
    let n = SIGNALS.fetch_add(1, Ordering::SeqCst);
    if mode == Mode::Finish && n == 0 {
        eprintln!(
            "\ninterrupted: finishing the current measurement, then writing the report (again to stop now)"
        );
        return;
    }
    EXITING.store(true, Ordering::SeqCst);
    let (children, temps) = {
        let mut r = registry();
        (
            std::mem::take(&mut r.children),
            std::mem::take(&mut r.temps),
        )
    };
    for &(_, pid) in &children {
        kill_group(pid);
    }
    for (_, p) in &temps {
        let _ = if p.is_dir() {
            std::fs::remove_dir_all(p)
        } else {
            std::fs::remove_file(p)
        };
    }
    eprintln!(
        "\ninterrupted: stopped {} child process(es), removed {} temporary path(s)",
        children.len(),
        temps.len()
    );
    std::process::exit(INTERRUPTED.into());
}

/// Kills the process group led by `pid` and reaps `pid` (waiting at most
/// a few seconds: a process stuck in the kernel must not hold the exit).
#[cfg(unix)]
fn kill_group(pid: u32) {
    use nix::sys::signal::{killpg, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;
    let p = Pid::from_raw(pid as i32);
    let _ = killpg(p, Signal::SIGKILL);
    for _ in 0..500 {
        match waitpid(p, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => std::thread::sleep(std::time::Duration::from_millis(10)),
            _ => return,
        }
    }
}

#[cfg(not(unix))]
fn kill_group(_pid: u32) {}

/// Starts `cmd` as the leader of a new process group (see the module
/// comment), tracked until the guard drops.
pub fn spawn_group(cmd: &mut Command) -> std::io::Result<(Child, ChildGuard)> {
    #[cfg(unix)]
    {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
    }
    // Registered under the lock the handler takes, so a signal between the
    // spawn and the registration cannot miss the child.
    let mut r = registry();
    let child = cmd.spawn()?;
    r.next += 1;
    let id = r.next;
    r.children.push((id, child.id()));
    Ok((child, ChildGuard(id)))
}

/// Tracks `path` (a file or directory) as temporary until the guard drops;
/// the owner removes it itself on every other path.
pub fn track_temp(path: PathBuf) -> TempGuard {
    let mut r = registry();
    r.next += 1;
    let id = r.next;
    r.temps.push((id, path));
    TempGuard(id)
}

/// Unregisters its child on drop (the owner has reaped it by then).
#[derive(Debug)]
pub struct ChildGuard(usize);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        registry().children.retain(|(id, _)| *id != self.0);
    }
}

/// Unregisters its path on drop.
#[derive(Debug)]
pub struct TempGuard(usize);

impl Drop for TempGuard {
    fn drop(&mut self) {
        registry().temps.retain(|(id, _)| *id != self.0);
    }
}

/// After a command returns: when the handler is stopping children to exit,
/// wait for it rather than exit with the command's own result (a worker
/// the handler killed looks like a worker that died).
pub fn settle() {
    while EXITING.load(Ordering::SeqCst) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
