//! A worker process: spawn, wait for `ready`, one request -> one reply,
//! quit. stdout is read by a thread into a channel so every reply can be
//! awaited with a timeout; stderr is read by another thread into a log file
//! (optionally echoed with the arm's name) and a ring of its last lines,
//! which every error quotes.

use super::protocol::{quit_request, Ready};
use super::AbError;
use serde::de::DeserializeOwned;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines of the worker's stderr kept for error messages.
pub const STDERR_TAIL: usize = 30;

/// What to start and how.
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// "baseline" or "candidate".
    pub arm: String,
    pub bin: PathBuf,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    /// Where the worker's stderr is written (None: not kept on disk).
    pub log: Option<PathBuf>,
    /// Echo the worker's stderr to ours, prefixed with the arm.
    pub echo: bool,
}

pub struct Worker {
    pub arm: String,
    bin: String,
    child: Child,
    /// Keeps the child on the interrupt handler's list until it is reaped
    /// (dropped after `Drop::drop` has waited for it).
    _tracked: crate::interrupt::ChildGuard,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    tail: Arc<Mutex<VecDeque<String>>>,
    stderr_thread: Option<JoinHandle<()>>,
    timeout: Duration,
    /// The worker's ready line.
    pub ready: Ready,
}

impl Worker {
    /// Starts the worker without waiting for it (`wait_ready` does), so two
    /// workers load side by side.
    pub fn start(spec: &WorkerSpec, timeout: Duration) -> Result<Worker, AbError> {
        let bin = spec.bin.display().to_string();
        let (mut child, tracked) = crate::interrupt::spawn_group(
            Command::new(&spec.bin)
                .args(&spec.args)
                .current_dir(&spec.cwd)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .map_err(|e| AbError::Worker {
            arm: spec.arm.clone(),
            bin: bin.clone(),
            msg: format!("cannot start `{bin} {}`: {e}", spec.args.join(" ")),
            stderr_tail: Vec::new(),
        })?;
        let stdin = child.stdin.take();
        let (tx, lines) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for l in BufReader::new(out).lines() {
                    let stop = l.is_err();
                    if tx.send(l).is_err() || stop {
                        break;
                    }
                }
            });
        }
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let stderr_thread = child.stderr.take().map(|err| {
            let tail = Arc::clone(&tail);
            let mut log = spec
                .log
                .as_ref()
                // Appended: a restarted worker (--respawn) keeps one log.
                .and_then(|p| {
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(p)
                        .ok()
                });
            let echo = spec.echo.then(|| spec.arm.clone());
            std::thread::spawn(move || {
                for l in BufReader::new(err).lines() {
                    let Ok(l) = l else { break };
                    if let Some(f) = log.as_mut() {
                        let _ = writeln!(f, "{l}");
                    }
                    if let Some(a) = &echo {
                        eprintln!("[{a}] {l}");
                    }
                    if let Ok(mut t) = tail.lock() {
                        if t.len() == STDERR_TAIL {
                            t.pop_front();
                        }
                        t.push_back(l);
                    }
                }
            })
        });
        Ok(Worker {
            arm: spec.arm.clone(),
            bin,
            child,
            _tracked: tracked,
            stdin,
            lines,
            tail,
            stderr_thread,
            timeout,
            ready: Ready::default(),
        })
    }

    /// Waits for the ready line.
    pub fn wait_ready(&mut self) -> Result<&Ready, AbError> {
        let line = self.next_line("waiting for the ready line")?;
        let v: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| self.fail(format!("the first line is not JSON ({e}): {}", clip(&line))))?;
        if v.get("ready") != Some(&serde_json::Value::Bool(true)) {
            let msg = match v.get("error").and_then(|e| e.as_str()) {
                Some(e) => format!("did not start: {e}"),
                None => format!(
                    "the first line is not {{\"ready\":true,...}}: {}",
                    clip(&line)
                ),
            };
            return Err(self.fail(msg));
        }
        self.ready = serde_json::from_value(v)
            .map_err(|e| self.fail(format!("malformed ready line ({e}): {}", clip(&line))))?;
        Ok(&self.ready)
    }

    /// Sends one request and reads its reply as `T`.
    pub fn request<T: DeserializeOwned>(&mut self, req: &serde_json::Value) -> Result<T, AbError> {
        let op = req
            .get("op")
            .and_then(|o| o.as_str())
            .unwrap_or("?")
            .to_string();
        self.send(req)?;
        let line = self.next_line(&format!("waiting for the reply to '{op}'"))?;
        let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| {
            self.fail(format!(
                "the reply to '{op}' is not JSON ({e}): {}",
                clip(&line)
            ))
        })?;
        match v.get("ok") {
            Some(serde_json::Value::Bool(true)) => {}
            Some(serde_json::Value::Bool(false)) => {
                let e = v
                    .get("error")
                    .and_then(|e| e.as_str())
                    .unwrap_or("(no error text)");
                return Err(self.fail(format!("'{op}' failed: {e}")));
            }
            _ => {
                return Err(self.fail(format!(
                    "the reply to '{op}' has no \"ok\": {}",
                    clip(&line)
                )))
            }
        }
        serde_json::from_value(v)
            .map_err(|e| self.fail(format!("malformed reply to '{op}' ({e}): {}", clip(&line))))
    }

    fn send(&mut self, req: &serde_json::Value) -> Result<(), AbError> {
        let r = match self.stdin.as_mut() {
            Some(w) => writeln!(w, "{req}").and_then(|_| w.flush()),
            None => Err(std::io::Error::other("stdin closed")),
        };
        r.map_err(|e| self.fail(format!("cannot write a request: {e}")))
    }

    fn next_line(&mut self, what: &str) -> Result<String, AbError> {
        loop {
            match self.lines.recv_timeout(self.timeout) {
                Ok(Ok(l)) if l.trim().is_empty() => continue,
                Ok(Ok(l)) => return Ok(l),
                Ok(Err(e)) => return Err(self.fail(format!("stdout unreadable {what}: {e}"))),
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    return Err(self.fail(format!(
                        "no answer within {} s {what}; killed",
                        self.timeout.as_secs()
                    )));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self
                        .child
                        .wait()
                        .map_or("unknown".to_string(), |s| s.to_string());
                    return Err(self.fail(format!("exited ({status}) {what}")));
                }
            }
        }
    }

    /// The error for `msg`, with the stderr tail (after the stderr thread
    /// has drained, for at most a second, when the worker is gone).
    pub fn error(&mut self, msg: String) -> AbError {
        self.fail(msg)
    }

    fn fail(&mut self, msg: String) -> AbError {
        let gone = matches!(self.child.try_wait(), Ok(Some(_)));
        let deadline =
            std::time::Instant::now() + Duration::from_millis(if gone { 1000 } else { 50 });
        while std::time::Instant::now() < deadline
            && self
                .stderr_thread
                .as_ref()
                .is_some_and(|h| !h.is_finished())
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        AbError::Worker {
            arm: self.arm.clone(),
            bin: self.bin.clone(),
            msg,
            stderr_tail: self.stderr_tail(),
        }
    }

    pub fn stderr_tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .map(|t| t.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Asks the worker to quit and waits for it (killed after 10 s).
    pub fn quit(mut self) -> Result<(), AbError> {
        let _ = self.send(&quit_request());
        self.stdin = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) if s.success() => return Ok(()),
                Ok(Some(s)) => return Err(self.fail(format!("exited with {s} after 'quit'"))),
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    return Err(self.fail("did not exit within 10 s of 'quit'; killed".into()));
                }
            }
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn clip(s: &str) -> String {
    crate::util::clip(s.trim(), 200)
}

/// The worker's command line: `bench --worker` and the options both arms
/// share, then the arm's own (`--profile`).
pub fn worker_args(common: &[String], profile: Option<&str>) -> Vec<String> {
    let mut v = vec!["bench".to_string(), "--worker".to_string()];
    v.extend(common.iter().cloned());
    if let Some(p) = profile {
        v.push("--profile".into());
        v.push(p.to_string());
    }
    v
}
