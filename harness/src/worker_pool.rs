//! A pool of workers that take tasks from one queue as they finish the last
//! one (dynamic hand-out: a slow task never holds up the others), and the
//! JSON-lines protocol of a worker process.
//!
//! Each worker lives on its own thread of the caller's process and is
//! built there (so it may own a CUDA context, which is not `Send`). A worker
//! is either in-process (`FnWorker`) or a child process (`ProcessWorker`,
//! one per GPU, as `bench --worker` serves `ab`): the child prints one
//! `{"ready": ...}` line, then answers each `{"task": ...}` line on its
//! stdin with one `{"ok": ...}` or `{"err": "..."}` line, and exits when its
//! stdin closes. Lines on the child's stdout that are not protocol messages
//! are passed to stderr. Results reach the caller's thread in the order they
//! finish, through `on_done`; the caller is the only writer of what follows
//! (the results log), so nothing needs a lock beyond the queue.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum WorkerError {
    /// The task failed; the worker takes the next one.
    #[error("{0}")]
    Task(String),
    /// The worker is gone (its process exited, its pipe broke): it is retired.
    #[error("{0}")]
    Dead(String),
}

/// Runs one task at a time.
pub trait Worker<T, R> {
    fn run(&mut self, task: &T) -> Result<R, WorkerError>;
}

/// An in-process worker: a closure.
pub struct FnWorker<F>(pub F);

impl<T, R, F: FnMut(&T) -> Result<R, String>> Worker<T, R> for FnWorker<F> {
    fn run(&mut self, task: &T) -> Result<R, WorkerError> {
        (self.0)(task).map_err(WorkerError::Task)
    }
}

/// Builds a worker on its thread.
pub type Starter<'a, W> = Box<dyn FnOnce() -> Result<W, String> + Send + 'a>;

/// One finished task.
pub struct Done<T, R> {
    /// Index of the worker (its starter) that ran it.
    pub worker: usize,
    pub task: T,
    pub result: Result<R, String>,
}

/// What a pool run left.
#[derive(Debug)]
pub struct PoolEnd<T> {
    /// Tasks never started: `stop` was set, or no worker was left.
    pub not_run: Vec<T>,
    /// Workers that could not start or died, with why.
    pub lost_workers: Vec<(usize, String)>,
}

/// The queue: tasks by phase, and the tasks handed out and not yet
/// answered, by phase.
struct Queue<T> {
    queued: BTreeMap<usize, VecDeque<T>>,
    in_flight: BTreeMap<usize, usize>,
}

impl<T> Queue<T> {
    fn push(&mut self, phase: usize, t: T) {
        self.queued.entry(phase).or_default().push_back(t);
    }
    /// The next task if its phase may start: no task of an earlier phase
    /// is queued or running. `Err(true)` when nothing is left at all.
    fn take(&mut self) -> Result<(usize, T), bool> {
        let first_queued = self
            .queued
            .iter()
            .find(|(_, q)| !q.is_empty())
            .map(|(&p, _)| p);
        let first_running = self.in_flight.iter().find(|(_, &n)| n > 0).map(|(&p, _)| p);
        match (first_queued, first_running) {
            (None, None) => Err(true),
            (Some(p), r) if r.is_none_or(|r| r >= p) => {
                let t = self
                    .queued
                    .get_mut(&p)
                    .and_then(VecDeque::pop_front)
                    .ok_or(false)?;
                *self.in_flight.entry(p).or_default() += 1;
                Ok((p, t))
            }
            _ => Err(false),
        }
    }
}

/// Runs `tasks` on the workers `starters` build; returns once every task
/// is done or no worker can take one. A task's phase (`phase`) orders the
/// work: no task starts while a task of an earlier phase is queued or
/// running, so phases never interleave on a worker (tasks of one phase run
/// in queue order). `on_done` runs on the caller's thread for each
/// finished task and returns the tasks it makes possible (e.g. the
/// timings of a cell whose check passed), queued before any worker may
/// start a later phase.
pub fn run_pool<'a, T, R, W>(
    starters: Vec<Starter<'a, W>>,
    tasks: Vec<T>,
    phase: impl Fn(&T) -> usize + Sync,
    stop: Option<&AtomicBool>,
    mut on_done: impl FnMut(Done<T, R>) -> Vec<T>,
) -> PoolEnd<T>
where
    T: Send,
    R: Send,
    W: Worker<T, R>,
{
    enum Msg<T, R> {
        Done(usize, Done<T, R>),
        Lost(usize, String),
    }
    let mut q = Queue {
        queued: BTreeMap::new(),
        in_flight: BTreeMap::new(),
    };
    for t in tasks {
        q.push(phase(&t), t);
    }
    let state = Mutex::new(q);
    let wake = Condvar::new();
    let mut lost = Vec::new();
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Msg<T, R>>();
        for (wi, start) in starters.into_iter().enumerate() {
            let tx = tx.clone();
            let (state, wake) = (&state, &wake);
            scope.spawn(move || {
                let mut w = match start() {
                    Ok(w) => w,
                    Err(e) => {
                        let _ = tx.send(Msg::Lost(wi, e));
                        return;
                    }
                };
                loop {
                    let next = {
                        let Ok(mut g) = state.lock() else { return };
                        loop {
                            if stop.is_some_and(|s| s.load(Ordering::SeqCst)) {
                                return;
                            }
                            match g.take() {
                                Ok(t) => break t,
                                Err(true) => return,
                                Err(false) => {
                                    g = match wake.wait_timeout(g, Duration::from_millis(100)) {
                                        Ok((g, _)) => g,
                                        Err(_) => return,
                                    };
                                }
                            }
                        }
                    };
                    let (p, task) = next;
                    // A panic in a worker becomes its death, so the task
                    // still counts as answered and the pool never waits
                    // for it.
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.run(&task)))
                        .unwrap_or_else(|_| Err(WorkerError::Dead("the worker panicked".into())));
                    let dead = matches!(r, Err(WorkerError::Dead(_)));
                    let result = r.map_err(|e| e.to_string());
                    let why = result.as_ref().err().cloned();
                    let _ = tx.send(Msg::Done(
                        p,
                        Done {
                            worker: wi,
                            task,
                            result,
                        },
                    ));
                    if dead {
                        let _ = tx.send(Msg::Lost(wi, why.unwrap_or_default()));
                        return;
                    }
                }
            });
        }
        drop(tx);
        for m in rx {
            match m {
                Msg::Done(p, d) => {
                    let more = on_done(d);
                    if let Ok(mut g) = state.lock() {
                        for t in more {
                            let ph = phase(&t);
                            g.push(ph, t);
                        }
                        if let Some(n) = g.in_flight.get_mut(&p) {
                            *n = n.saturating_sub(1);
                        }
                    }
                    wake.notify_all();
                }
                Msg::Lost(wi, why) => lost.push((wi, why)),
            }
        }
    });
    let not_run = state
        .into_inner()
        .map(|q| q.queued.into_values().flatten().collect())
        .unwrap_or_default();
    PoolEnd {
        not_run,
        lost_workers: lost,
    }
}

/// A message of the worker protocol (either direction).
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Message<V> {
    Ready(serde_json::Value),
    Task(V),
    Ok(V),
    Err(String),
}

/// A worker process speaking the protocol on its stdin/stdout.
pub struct ProcessWorker {
    name: String,
    child: Child,
    _guard: crate::interrupt::ChildGuard,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    /// What the worker said in its ready line (its device, for instance).
    pub ready: serde_json::Value,
}

impl ProcessWorker {
    /// Starts `cmd` (stdin and stdout piped, stderr inherited) in its own
    /// process group (SIGINT/SIGTERM of the caller stops it) and waits for
    /// its ready line.
    pub fn spawn(name: &str, mut cmd: Command) -> Result<ProcessWorker, String> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let (mut child, guard) = crate::interrupt::spawn_group(&mut cmd)
            .map_err(|e| format!("{name}: cannot start: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            let _ = child.kill();
            return Err(format!("{name}: no pipes"));
        };
        let mut w = ProcessWorker {
            name: name.to_string(),
            child,
            _guard: guard,
            stdin: Some(stdin),
            stdout: BufReader::new(stdout),
            ready: serde_json::Value::Null,
        };
        match w.read::<serde_json::Value>() {
            Ok(Message::Ready(v)) => {
                w.ready = v;
                Ok(w)
            }
            Ok(Message::Err(e)) => Err(format!("{name}: {e}")),
            Ok(_) => Err(format!("{name}: spoke before it was ready")),
            Err(e) => Err(e.to_string()),
        }
    }

    fn read<V: DeserializeOwned>(&mut self) -> Result<Message<V>, WorkerError> {
        loop {
            let mut line = String::new();
            let n = self
                .stdout
                .read_line(&mut line)
                .map_err(|e| WorkerError::Dead(format!("{}: read: {e}", self.name)))?;
            if n == 0 {
                let status = self
                    .child
                    .wait()
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                return Err(WorkerError::Dead(format!(
                    "{}: exited ({status}) without an answer",
                    self.name
                )));
            }
            let t = line.trim();
            if t.starts_with('{') {
                if let Ok(m) = serde_json::from_str::<Message<V>>(t) {
                    return Ok(m);
                }
            }
            eprintln!("{}: {t}", self.name);
        }
    }
}

impl<T: Serialize, R: DeserializeOwned> Worker<T, R> for ProcessWorker {
    fn run(&mut self, task: &T) -> Result<R, WorkerError> {
        let mut line = serde_json::to_string(&Message::Task(task))
            .map_err(|e| WorkerError::Task(format!("cannot encode the task: {e}")))?;
        line.push('\n');
        let name = self.name.clone();
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| WorkerError::Dead(format!("{name}: stdin closed")))?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .map_err(|e| WorkerError::Dead(format!("{name}: write: {e}")))?;
        match self.read::<R>()? {
            Message::Ok(r) => Ok(r),
            Message::Err(e) => Err(WorkerError::Task(e)),
            _ => Err(WorkerError::Dead(format!("{name}: answered out of turn"))),
        }
    }
}

impl Drop for ProcessWorker {
    fn drop(&mut self) {
        // Closing stdin ends the worker's loop; one that does not end in a
        // few seconds is killed.
        self.stdin = None;
        for _ in 0..300 {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The worker side: prints the ready line, then answers every task line on
/// stdin with `handle`'s result, until stdin closes.
pub fn serve<T, R>(
    ready: serde_json::Value,
    mut handle: impl FnMut(T) -> Result<R, String>,
) -> anyhow::Result<()>
where
    T: DeserializeOwned,
    R: Serialize,
{
    let stdout = std::io::stdout();
    let say = |m: &Message<R>| -> anyhow::Result<()> {
        let mut out = stdout.lock();
        serde_json::to_writer(&mut out, m)?;
        out.write_all(b"\n")?;
        out.flush()?;
        Ok(())
    };
    say(&Message::Ready(ready))?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let answer = match serde_json::from_str::<Message<T>>(&line) {
            Ok(Message::Task(t)) => match handle(t) {
                Ok(r) => Message::Ok(r),
                Err(e) => Message::Err(e),
            },
            Ok(_) => Message::Err("expected a task".into()),
            Err(e) => Message::Err(format!("unreadable task: {e}")),
        };
        say(&answer)?;
    }
    Ok(())
}

/// The worker side when it cannot start: one error line instead of ready.
pub fn refuse(why: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &Message::<()>::Err(why.to_string()))?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Follow-up tasks of a later phase start only once every task of the
    /// earlier phase has finished, on every worker.
    #[test]
    fn phases_never_interleave() {
        let starters: Vec<Starter<'_, FnWorker<_>>> = (0..3)
            .map(|_| {
                Box::new(|| {
                    Ok(FnWorker(|t: &(usize, usize)| {
                        std::thread::sleep(std::time::Duration::from_millis((t.1 % 3) as u64));
                        Ok(*t)
                    }))
                }) as Starter<'_, _>
            })
            .collect();
        let mut order = Vec::new();
        let end = run_pool(
            starters,
            (0..12).map(|i| (0usize, i)).collect(),
            |t| t.0,
            None,
            |d: Done<(usize, usize), (usize, usize)>| {
                let t = d.result.unwrap_or((9, 9));
                order.push(t);
                if t.0 == 0 {
                    vec![(1, t.1), (2, t.1)]
                } else {
                    Vec::new()
                }
            },
        );
        assert!(end.not_run.is_empty());
        assert_eq!(order.len(), 36);
        let phases: Vec<usize> = order.iter().map(|t| t.0).collect();
        let mut sorted = phases.clone();
        sorted.sort();
        assert_eq!(phases, sorted, "phases interleaved: {order:?}");
    }

    /// Every task runs exactly once, spread over the workers, and a worker
    /// that dies (or panics) mid-way hands its queue to the others.
    #[test]
    fn tasks_run_once_across_workers() {
        struct W {
            id: usize,
        }
        impl Worker<usize, (usize, usize)> for W {
            fn run(&mut self, t: &usize) -> Result<(usize, usize), WorkerError> {
                if *t == 30 {
                    return Err(WorkerError::Dead("gone".into()));
                }
                if *t == 17 {
                    panic!("a worker bug");
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
                Ok((*t, self.id))
            }
        }
        let starters: Vec<Starter<'_, W>> = (0..3)
            .map(|id| Box::new(move || Ok(W { id })) as Starter<'_, W>)
            .collect();
        let mut ok = Vec::new();
        let mut failed = Vec::new();
        let end = run_pool(
            starters,
            (0..40).collect(),
            |_| 0,
            None,
            |d| {
                match d.result {
                    Ok((t, _)) => ok.push(t),
                    Err(_) => failed.push(d.task),
                }
                Vec::new()
            },
        );
        assert!(end.not_run.is_empty());
        assert_eq!(end.lost_workers.len(), 2);
        assert_eq!(failed.len(), 2);
        let mut all: Vec<usize> = ok.iter().chain(&failed).copied().collect();
        all.sort();
        assert_eq!(all, (0..40).collect::<Vec<_>>());
    }
}
