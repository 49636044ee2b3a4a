//! The engine interface the CPU and CUDA forwards both implement, and the
//! one generation loop `run`, `bench` and `ab` share.
//!
//! An engine holds one sequence: `forward` appends tokens at `position()`
//! and returns the logits of the rows asked for; `reset` starts over. The
//! generation loop (prefill, then one token at a time until a stop token,
//! the token budget or the end of the context) lives here, not in a CLI.

use std::time::{Duration, Instant};

use crate::cpu::CpuEngine;
use crate::forward::{forward_in_chunks_into, Chunk, ForwardError, LogitRows, Logits, SeqState};
use crate::model::Model;
use crate::sampler::Sampler;
use crate::step_bytes::StepReads;

/// GPU time per forward phase, in milliseconds, accumulated since the last
/// `take_phases` (only engines that measure phases report them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// (phase, total ms, marks), in first-seen order. A mark starts a
    /// phase; the time up to the next mark is the phase's.
    pub phases: Vec<(String, f64, usize)>,
    /// Decode steps replayed through the timed graph (their phases come
    /// from event-record nodes inside it), and the GPU time of those
    /// replays from events recorded around each launch, outside the graph:
    /// the phases of a replay sum to its span less the graph's start
    /// latency.
    pub graph_steps: usize,
    pub graph_ms: f64,
}

impl PhaseTimes {
    pub fn add(&mut self, phase: &str, ms: f64) {
        match self.phases.iter_mut().find(|(p, _, _)| p == phase) {
            Some(e) => {
                e.1 += ms;
                e.2 += 1;
            }
            None => self.phases.push((phase.to_string(), ms, 1)),
        }
    }
    pub fn total_ms(&self) -> f64 {
        self.phases.iter().map(|p| p.1).sum()
    }
    pub fn get(&self, phase: &str) -> f64 {
        self.phases
            .iter()
            .find(|p| p.0 == phase)
            .map(|p| p.1)
            .unwrap_or(0.0)
    }
}

/// Errors of an engine call.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// A device, driver, compile or launch failure.
    #[error("CUDA engine: {0}")]
    Device(String),
}

/// A Gemma 4 forward pass over one sequence.
///
/// A backend implements `run_chunk`; `forward` (provided) checks a call's
/// input once and cuts it into chunks of at most `chunk_len` tokens
/// (`forward::forward_in_chunks_into`), so both backends validate and chunk in
/// one place.
pub trait Engine {
    fn model(&self) -> &Model;
    /// "cpu" or "cuda".
    fn backend(&self) -> &'static str;
    /// Positions already in the cache (the next token's position).
    fn position(&self) -> usize;
    /// Most positions the cache holds.
    fn max_seq(&self) -> usize;
    /// Most tokens one chunk may hold (the prefill batch).
    fn chunk_len(&self) -> usize;
    /// Starts a new sequence.
    fn reset(&mut self);
    /// Runs one chunk at `position()` (at most `chunk_len` tokens, already
    /// checked against the vocabulary and the cache), appends its K/V,
    /// advances the position by its length and writes the logits of its
    /// `keep` rows to `out` (`[keep.len()][vocab]`).
    fn run_chunk(&mut self, chunk: Chunk<'_>, out: &mut [f32]) -> Result<(), EngineError>;
    /// Runs `tokens` at `position()..`, appends their K/V and returns the
    /// logits of `rows`.
    fn forward(&mut self, tokens: &[u32], rows: LogitRows) -> Result<Logits, EngineError> {
        let mut out = Logits::default();
        self.forward_into(tokens, rows, &mut out)?;
        Ok(out)
    }
    /// `forward` into `out`, reusing its buffers (a decode loop passes the
    /// same `Logits` every step and allocates the vocabulary row once).
    fn forward_into(
        &mut self,
        tokens: &[u32],
        rows: LogitRows,
        out: &mut Logits,
    ) -> Result<(), EngineError> {
        let st = SeqState {
            position: self.position(),
            max_seq: self.max_seq(),
            context_length: self.model().config().context_length,
            chunk: self.chunk_len(),
            vocab: self.model().vocab_size(),
        };
        forward_in_chunks_into(st, tokens, rows, out, |c, o| self.run_chunk(c, o))
    }
    /// Phase times accumulated since the last call (None: not measured).
    fn take_phases(&mut self) -> Option<PhaseTimes> {
        None
    }
    /// Turns per-phase timing on or off; false when the engine cannot
    /// measure phases. Measuring costs events on the stream; decode steps
    /// replay a second graph captured with an event-record node at each
    /// phase (eagerly under `--no-graph`).
    fn set_phases(&mut self, on: bool) -> bool {
        let _ = on;
        false
    }
    /// One line per engine slot: what serves it and why (`run -v`).
    fn describe(&self) -> Vec<String> {
        Vec::new()
    }
    /// What one decode step reads apart from the KV cache, as this backend
    /// stores the model (`step_bytes`); None when not known.
    fn step_reads(&self) -> Option<StepReads> {
        None
    }
    /// One line naming every weight converted lossily at load, when any was
    /// (`run` and `bench` print it).
    fn conversion_notice(&self) -> Option<String> {
        None
    }
}

impl Engine for CpuEngine<'_> {
    fn model(&self) -> &Model {
        CpuEngine::model(self)
    }
    fn backend(&self) -> &'static str {
        "cpu"
    }
    fn position(&self) -> usize {
        CpuEngine::position(self)
    }
    fn max_seq(&self) -> usize {
        CpuEngine::max_seq(self)
    }
    fn chunk_len(&self) -> usize {
        self.max_batch()
    }
    fn reset(&mut self) {
        CpuEngine::reset(self)
    }
    fn run_chunk(&mut self, chunk: Chunk<'_>, out: &mut [f32]) -> Result<(), EngineError> {
        Ok(CpuEngine::run_chunk(self, chunk, out)?)
    }
    fn describe(&self) -> Vec<String> {
        vec![format!(
            "cpu: f32 reference forward, batches of {} tokens, cache of {} positions",
            self.max_batch(),
            CpuEngine::max_seq(self)
        )]
    }
    fn step_reads(&self) -> Option<StepReads> {
        Some(StepReads::of_cpu_model(CpuEngine::model(self)))
    }
}

/// Token ids that end a generation: `<eos>` and `<turn|>` (end of turn).
pub const STOP_IDS: [u32; 2] = [1, 106];

/// What a generation did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenStats {
    pub prompt_tokens: usize,
    pub prefill: Duration,
    /// Generated tokens (the first comes from the prefill's logits).
    pub generated: Vec<u32>,
    /// Single-token forward passes and their time.
    pub decode_steps: usize,
    pub decode: Duration,
    /// Stopped because the context was full.
    pub hit_context: bool,
}

impl GenStats {
    pub fn prefill_tps(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill)
    }
    pub fn decode_tps(&self) -> f64 {
        rate(self.decode_steps, self.decode)
    }
}

fn rate(n: usize, t: Duration) -> f64 {
    let s = t.as_secs_f64();
    if n == 0 || s <= 0.0 {
        0.0
    } else {
        n as f64 / s
    }
}

/// Prefills `prompt`, then samples up to `max_new` tokens (None: until the
/// end of the context), one forward pass each, calling `on_token` with
/// every token before the next pass (it returns false to stop early).
/// Stops at a stop id or a tokenizer end-of-generation token (`is_stop`).
pub fn generate(
    engine: &mut dyn Engine,
    prompt: &[u32],
    sampler: &mut Sampler,
    max_new: Option<usize>,
    is_stop: &dyn Fn(u32) -> bool,
    on_token: &mut dyn FnMut(u32) -> Result<bool, EngineError>,
) -> Result<GenStats, EngineError> {
    let mut st = GenStats {
        prompt_tokens: prompt.len(),
        ..GenStats::default()
    };
    let t0 = Instant::now();
    let logits = engine.forward(prompt, LogitRows::Last)?;
    st.prefill = t0.elapsed();
    let last = logits
        .last()
        .ok_or_else(|| EngineError::Device("the prefill returned no logits row".into()))?;
    let mut next = sampler.sample(last);
    let budget = max_new.unwrap_or(usize::MAX);
    let mut l = Logits::default();
    loop {
        if budget == 0 || is_stop(next) || STOP_IDS.contains(&next) {
            break;
        }
        st.generated.push(next);
        if !on_token(next)? || st.generated.len() >= budget {
            break;
        }
        if engine.position() >= engine.max_seq() {
            st.hit_context = true;
            break;
        }
        let t = Instant::now();
        engine.forward_into(&[next], LogitRows::Last, &mut l)?;
        st.decode += t.elapsed();
        st.decode_steps += 1;
        let row = l
            .last()
            .ok_or_else(|| EngineError::Device("a decode step returned no logits row".into()))?;
        next = sampler.sample(row);
    }
    Ok(st)
}
