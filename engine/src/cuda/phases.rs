//! GPU time per forward phase from CUDA events (`--profile-phases`, bench,
//! ab): an event is recorded on the stream where each phase starts, and the
//! time between consecutive events is charged to the phase that began at
//! the first of them. Off by default: the events cost stream work.

use gemtune_kernels::gpu::{Event, Gpu, GpuError};

use super::slots::Phase;
use crate::engine::PhaseTimes;

pub struct Phases {
    marks: Vec<(Option<Phase>, Event)>,
    pool: Vec<Event>,
    totals: PhaseTimes,
}

impl Phases {
    pub fn new() -> Phases {
        Phases {
            marks: Vec::new(),
            pool: Vec::new(),
            totals: PhaseTimes::default(),
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
        gpu.record(&e)?;
        self.marks.push((phase, e));
        Ok(())
    }

    /// Closes the last phase, waits for the events and adds their spans to
    /// the totals.
    pub fn collect(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        if self.marks.is_empty() {
            return Ok(());
        }
        self.record(gpu, None)?;
        let marks = std::mem::take(&mut self.marks);
        for w in marks.windows(2) {
            let ms = w[0].1.elapsed_ms(&w[1].1)?;
            if let Some(p) = w[0].0 {
                self.totals.add(p.name(), ms as f64);
            }
        }
        self.pool.extend(marks.into_iter().map(|(_, e)| e));
        Ok(())
    }

    pub fn take(&mut self) -> PhaseTimes {
        std::mem::take(&mut self.totals)
    }
}

impl Default for Phases {
    fn default() -> Self {
        Phases::new()
    }
}
