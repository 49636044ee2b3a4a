//! GPU time per forward phase from CUDA events (`--profile-phases`, bench,
//! ab): an event is recorded on the stream where each phase starts, and the
//! time between consecutive events is charged to the phase that began at
//! the first of them. Off by default: the events cost stream work.
//!
//! Two ways to record, one set of marks (the stages call `mark` either way):
//! - eager chunks (prefill, `--no-graph` decode): each mark records a
//!   pooled event on the stream as the stage is enqueued;
//! - graph decode: a second decode graph (`TimedGraph`) is captured with
//!   each mark as an event-record node (`Gpu::record_external`), so every
//!   replay records the marks again at the same points of the graph.
//!   Events recorded outside the graph around each replay give the
//!   replay's span, against which the phases can be checked. The timed
//!   graph is its own graph: the untimed one the engine replays when
//!   phases are off has no event nodes. An event-record node sits between
//!   two kernels, so it also stands between a kernel and a programmatic
//!   dependent launched after it: timing can cost the overlap those
//!   launches buy, which is why bench reports the timed and the untimed
//!   step side by side.
//!
//! A span runs from one mark to the next, so it holds the phase's kernels
//! and the time the GPU spends getting to them (a launch's latency, the
//! tail of the kernel before); events cannot tell those apart.

use gemtune_kernels::gpu::{Event, Gpu, GpuError};
use gemtune_kernels::runtime::Graph;

use super::slots::Phase;
use crate::engine::PhaseTimes;

/// The timed decode graph and the events its nodes record. Declared graph
/// first: it is dropped before the events its nodes name.
struct TimedGraph {
    graph: Graph,
    marks: Vec<(Option<Phase>, Event)>,
    /// Recorded on the stream just before and after each launch.
    start: Event,
    end: Event,
    /// A replay whose events `collect` has not read yet.
    pending: bool,
}

pub struct Phases {
    marks: Vec<(Option<Phase>, Event)>,
    pool: Vec<Event>,
    totals: PhaseTimes,
    /// Marks recorded as graph nodes while the timed graph is captured.
    capturing: Option<Vec<(Option<Phase>, Event)>>,
    timed: Option<TimedGraph>,
}

impl Phases {
    pub fn new() -> Phases {
        Phases {
            marks: Vec::new(),
            pool: Vec::new(),
            totals: PhaseTimes::default(),
            capturing: None,
            timed: None,
        }
    }

    /// Records the start of `phase` (and so the end of the previous one).
    pub fn mark(&mut self, gpu: &Gpu, phase: Phase) -> Result<(), GpuError> {
        self.record(gpu, Some(phase))
    }

    fn record(&mut self, gpu: &Gpu, phase: Option<Phase>) -> Result<(), GpuError> {
        let e = match self.pool.pop() {
            Some(e) => e,
            None => gpu.event()?,
        };
        match self.capturing.as_mut() {
            Some(marks) => {
                gpu.record_external(&e)?;
                marks.push((phase, e));
            }
            None => {
                gpu.record(&e)?;
                self.marks.push((phase, e));
            }
        }
        Ok(())
    }

    /// Closes the last phase, waits for the events and adds their spans to
    /// the totals; after a timed-graph replay, also that replay's marks and
    /// its span.
    pub fn collect(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        if let Some(t) = self.timed.as_mut().filter(|t| t.pending) {
            t.pending = false;
            add_spans(&mut self.totals, &t.marks)?;
            self.totals.graph_ms += t.start.elapsed_ms(&t.end)? as f64;
            self.totals.graph_steps += 1;
        }
        if self.marks.is_empty() {
            return Ok(());
        }
        self.record(gpu, None)?;
        let marks = std::mem::take(&mut self.marks);
        add_spans(&mut self.totals, &marks)?;
        self.pool.extend(marks.into_iter().map(|(_, e)| e));
        Ok(())
    }

    pub fn take(&mut self) -> PhaseTimes {
        std::mem::take(&mut self.totals)
    }

    /// Whether the timed decode graph has been captured.
    pub fn has_graph(&self) -> bool {
        self.timed.is_some()
    }

    /// Starts recording marks as graph nodes; the stream must be capturing.
    /// `expect` events are made first, so that the capture itself creates
    /// none.
    pub fn begin_capture(&mut self, gpu: &Gpu, expect: usize) -> Result<(), GpuError> {
        while self.pool.len() < expect {
            self.pool.push(gpu.event()?);
        }
        self.capturing = Some(Vec::new());
        Ok(())
    }

    /// Records the closing mark as a graph node (the stream still
    /// capturing).
    pub fn close_capture(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        self.record(gpu, None)
    }

    /// Ends recording marks as nodes. With the instantiated graph, keeps it
    /// with its marks as the timed graph; without (the capture failed), the
    /// marks' events go back to the pool.
    pub fn finish_capture(&mut self, gpu: &Gpu, graph: Option<Graph>) -> Result<(), GpuError> {
        let marks = self.capturing.take().unwrap_or_default();
        match graph {
            Some(graph) => {
                self.timed = Some(TimedGraph {
                    graph,
                    marks,
                    start: gpu.event()?,
                    end: gpu.event()?,
                    pending: false,
                });
            }
            None => self.pool.extend(marks.into_iter().map(|(_, e)| e)),
        }
        Ok(())
    }

    /// Replays the timed graph between two events of its own; `collect`
    /// reads them. Errors when no timed graph was captured.
    pub fn replay(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        let t = self
            .timed
            .as_mut()
            .ok_or_else(|| GpuError::Other("no timed decode graph was captured".into()))?;
        gpu.record(&t.start)?;
        t.graph.launch()?;
        gpu.record(&t.end)?;
        t.pending = true;
        Ok(())
    }

    /// Replays of the timed graph so far.
    pub fn graph_replays(&self) -> u64 {
        self.timed.as_ref().map_or(0, |t| t.graph.replays())
    }
}

/// Adds the spans between consecutive `marks` to `totals`, each to the
/// phase its first mark names (waits for the last).
fn add_spans(totals: &mut PhaseTimes, marks: &[(Option<Phase>, Event)]) -> Result<(), GpuError> {
    for w in marks.windows(2) {
        let ms = w[0].1.elapsed_ms(&w[1].1)?;
        if let Some(p) = w[0].0 {
            totals.add(p.name(), ms as f64);
        }
    }
    Ok(())
}

impl Default for Phases {
    fn default() -> Self {
        Phases::new()
    }
}
