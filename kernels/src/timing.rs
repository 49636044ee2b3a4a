//! Timing with CUDA events in two cache regimes, and the bandwidth ceilings.
//!
//! A sample brackets `launches_per_sample` back-to-back launches with one
//! pair of events and divides: for kernels of a few microseconds a pair of
//! events per launch would measure the event overhead, not the kernel.
//! Samples are enqueued in chunks so the host stays ahead of the GPU.
//!
//! How a sample's launches reach the GPU is the timing's `Launches` mode:
//! enqueued on the stream one by one (`stream`: every launch pays the
//! host's enqueue and the GPU's launch gap, as an eager engine does), or
//! captured once into a CUDA graph that each sample replays (`graph`: the
//! launch gaps of the engine's captured decode step), optionally with each
//! launch a programmatic dependent of the one before (`chained`: the
//! engine's chained decode step, whose next grid becomes resident while the
//! one ahead drains). A kernel of a few microseconds measures very
//! differently in the three, so every `Timing` says which it was.

use crate::compile::{compile_source, default_cache_dir, CompiledVariant};
use crate::defines::{DefineValue, Defines};
use crate::device::LaunchGeometry;
use crate::gpu::{Event, Gpu, GpuError, KArg, Module};
use crate::kernel_family::Family;
use crate::problem::Problem;
use crate::runtime::Graph;
use crate::workload::{OpKind, Workload};
use serde::{Deserialize, Serialize};

/// Which cache state the weights are measured in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Regime {
    /// The same buffers every call: L2-resident when they fit.
    L2,
    /// Weights rotated across enough copies to exceed 2x the L2 size;
    /// activations stay warm.
    Dram,
}

/// How the launches of a sample are enqueued (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Launches {
    /// One stream launch per call.
    #[default]
    Stream,
    /// The sample's launches captured into a CUDA graph, replayed per sample.
    Graph,
    /// As `Graph`, each launch after a kernel a programmatic dependent of it
    /// (PDL on sm_90 and later; stream order below).
    Chained,
}

impl Launches {
    pub fn name(self) -> &'static str {
        match self {
            Launches::Stream => "stream",
            Launches::Graph => "graph",
            Launches::Chained => "chained",
        }
    }
}

/// Seed of the inputs a timed call runs on (values do not change the time
/// of these kernels; one fixed seed keeps runs comparable).
pub const TIMING_SEED: u64 = 0x5eed_0001;

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingConfig {
    pub warmup_ms: f64,
    pub min_reps: usize,
    pub max_reps: usize,
    /// Stop when (p90 - p10) / median falls below this.
    pub target_rel_spread: f64,
    /// Stop sampling after this much measured GPU time.
    pub budget_ms: f64,
    /// How a sample's launches are enqueued.
    #[serde(default)]
    pub launches: Launches,
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            warmup_ms: 20.0,
            min_reps: 20,
            max_reps: 200,
            target_rel_spread: 0.03,
            budget_ms: 500.0,
            launches: Launches::Stream,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// Microseconds per call, one entry per sample.
    pub samples_us: Vec<f64>,
    pub weight_copies: usize,
    /// weight_copies x weight bytes: the footprint rotated through.
    pub rotated_bytes: u64,
    pub bytes_per_call: u64,
    pub ops_per_call: u64,
    pub op_kind: OpKind,
    pub launches_per_sample: usize,
    /// How the launches of a sample were enqueued.
    #[serde(default)]
    pub launches: Launches,
    /// Resident CTAs per SM the driver reports for this launch (0 when not
    /// known, e.g. for a vendor-library call).
    pub blocks_per_sm: u32,
    pub regime: Regime,
    /// Anything the reader should know (e.g. fewer copies than 2x L2 for
    /// lack of memory).
    pub note: String,
    /// Host time (`clocks::now_s`) when the warm-up began: clock samples
    /// from then on saw the device busy with this work.
    #[serde(default)]
    pub warmup_from_s: f64,
    /// Host time (`clocks::now_s`) when the measured samples began and
    /// ended (warm-up excluded): the window to read sampled clocks over.
    #[serde(default)]
    pub measured_from_s: f64,
    #[serde(default)]
    pub measured_to_s: f64,
}

impl Timing {
    /// Median of the samples (`quantile_sorted` at 0.5), NaN when empty.
    pub fn median_us(&self) -> f64 {
        let mut s = self.samples_us.clone();
        s.sort_by(f64::total_cmp);
        quantile_sorted(&s, 0.5)
    }
}

/// Quantile `q` in [0, 1] of sorted data by linear interpolation between
/// closest ranks (the "type 7" rule of R and NumPy); NaN for empty input.
/// The one quantile definition of the workspace: the timing loop, the
/// ceilings and the harness's statistics (`gemtune::stats`) all use it.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let q = q.clamp(0.0, 1.0);
    let h = (sorted.len() - 1) as f64 * q;
    let lo = h.floor() as usize;
    let hi = h.ceil() as usize;
    sorted[lo] + (h - lo as f64) * (sorted[hi] - sorted[lo])
}

fn rel_spread(samples: &[f64]) -> f64 {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let med = quantile_sorted(&s, 0.5);
    (quantile_sorted(&s, 0.9) - quantile_sorted(&s, 0.1)) / med
}

/// What the sampling loop needs from anything it times: the weight
/// rotation of the DRAM regime, one enqueued call, and the call's size.
/// A family's `Workload` (through its loaded module) and a vendor-library
/// reference (`crate::reference`) both implement it, so both are measured by
/// the same loop with the same statistics.
pub trait Timeable {
    /// Bytes of one copy of the rotated inputs (the weights); 0 when nothing
    /// is rotated.
    fn weight_bytes(&self) -> u64;
    /// Makes `n` weight copies in total (copy 0 is the original).
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError>;
    fn weight_copies(&self) -> usize;
    /// Enqueues one call on the GPU's stream using weight copy `copy`.
    fn enqueue(&self, gpu: &Gpu, copy: usize) -> Result<(), GpuError>;
    fn bytes_per_call(&self) -> u64;
    fn ops_per_call(&self) -> u64;
    fn op_kind(&self) -> OpKind;
}

/// A family workload bound to its loaded module.
struct Launched<'a> {
    wl: Box<dyn Workload>,
    module: &'a Module,
}

impl Timeable for Launched<'_> {
    fn weight_bytes(&self) -> u64 {
        self.wl.weight_bytes()
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.wl.set_weight_copies(gpu, n)
    }
    fn weight_copies(&self) -> usize {
        self.wl.weight_copies()
    }
    fn enqueue(&self, gpu: &Gpu, copy: usize) -> Result<(), GpuError> {
        self.wl.launch(gpu, self.module, copy)
    }
    fn bytes_per_call(&self) -> u64 {
        self.wl.bytes_per_call()
    }
    fn ops_per_call(&self) -> u64 {
        self.wl.ops_per_call()
    }
    fn op_kind(&self) -> OpKind {
        self.wl.op_kind()
    }
}

/// Times variant `cv` of `f` on problem `p` in `regime`.
pub fn time_variant(
    gpu: &Gpu,
    f: &dyn Family,
    cv: &CompiledVariant,
    d: &Defines,
    p: &Problem,
    regime: Regime,
    cfg: &TimingConfig,
) -> Result<Timing, GpuError> {
    let geo = f
        .validate(d, p, &gpu.limits())
        .map_err(|r| GpuError::Rejected(format!("{}: {r}", f.name())))?;
    let module = gpu.load(cv)?;
    let wl = f.workload(gpu, d, p, &geo, TIMING_SEED)?;
    let mut t = time_workload(
        gpu,
        &mut Launched {
            wl,
            module: &module,
        },
        regime,
        cfg,
    )?;
    t.blocks_per_sm = gpu.occupancy(&module, &geo)?;
    Ok(t)
}

/// Times anything `Timeable` in `regime`: weight copies for the DRAM regime,
/// warm-up until stable, then samples until the spread or the budget says
/// stop. `blocks_per_sm` is left 0 (the caller knows the launch, if any).
pub fn time_workload(
    gpu: &Gpu,
    wl: &mut dyn Timeable,
    regime: Regime,
    cfg: &TimingConfig,
) -> Result<Timing, GpuError> {
    let mut note = String::new();
    let wb = wl.weight_bytes();
    if regime == Regime::Dram && wb > 0 {
        let l2 = gpu.info().l2_bytes;
        let want = (2 * l2).div_ceil(wb) as usize + 1;
        let (free, _) = gpu.mem_info()?;
        let can = ((free as u64 / 2) / wb).max(1) as usize;
        let n = want.min(can);
        if n < want {
            note = format!(
                "only {n} weight copies fit in half the free memory ({} MB rotated < 2x L2)",
                (n as u64 * wb) >> 20
            );
        }
        wl.set_weight_copies(gpu, n)?;
    }
    let copies = wl.weight_copies();
    let launch = |wl: &dyn Timeable, i: usize| wl.enqueue(gpu, i % copies);
    // First launch: module warm, caches filled; then a single timed launch
    // estimates the duration.
    launch(&*wl, 0)?;
    gpu.synchronize()?;
    let e0 = gpu.event()?;
    let e1 = gpu.event()?;
    gpu.record(&e0)?;
    for i in 0..copies.max(4) {
        launch(&*wl, i)?;
    }
    gpu.record(&e1)?;
    let est_ms = e0.elapsed_ms(&e1)? as f64 / copies.max(4) as f64;
    // Aim for samples of >= 100 us (and a whole number of rotations).
    let mut lps = ((0.1 / est_ms.max(1e-6)).ceil() as usize).clamp(1, 2000);
    if copies > 1 {
        lps = lps.div_ceil(copies) * copies;
    }
    // Graph modes: one sample's launches, captured once (lps is a whole
    // number of rotations, so each replay reads every weight copy).
    let graph = match cfg.launches {
        Launches::Stream => None,
        Launches::Graph | Launches::Chained => Some(capture_sample(
            gpu,
            &*wl,
            lps,
            cfg.launches == Launches::Chained,
        )?),
    };
    let chunk = 10usize;
    let events: Vec<_> = (0..=chunk).map(|_| gpu.event()).collect::<Result<_, _>>()?;
    let mut counter = 0usize;
    let mut run_chunk = |wl: &dyn Timeable| -> Result<Vec<f64>, GpuError> {
        gpu.record(&events[0])?;
        for e in &events[1..] {
            match &graph {
                Some(g) => g.launch()?,
                None => {
                    for _ in 0..lps {
                        launch(wl, counter)?;
                        counter += 1;
                    }
                }
            }
            gpu.record(e)?;
        }
        let mut out = Vec::with_capacity(chunk);
        for w in events.windows(2) {
            out.push(w[0].elapsed_ms(&w[1])? as f64 * 1000.0 / lps as f64);
        }
        Ok(out)
    };
    // Warm-up until stable: three consecutive chunk medians within 2%, at
    // least warmup_ms, at most 4x warmup_ms.
    let warmup_from_s = crate::clocks::now_s();
    let mut warm_ms = 0.0;
    let mut medians: Vec<f64> = Vec::new();
    loop {
        let s = run_chunk(&*wl)?;
        warm_ms += s.iter().sum::<f64>() * lps as f64 / 1000.0;
        let mut ss = s.clone();
        ss.sort_by(f64::total_cmp);
        medians.push(quantile_sorted(&ss, 0.5));
        let stable = medians.len() >= 3 && {
            let t = &medians[medians.len() - 3..];
            let lo = t.iter().cloned().fold(f64::INFINITY, f64::min);
            let hi = t.iter().cloned().fold(0.0, f64::max);
            (hi - lo) / lo < 0.02
        };
        if (warm_ms >= cfg.warmup_ms && stable) || warm_ms >= 4.0 * cfg.warmup_ms.max(1.0) {
            break;
        }
    }
    // Each chunk ends in an event synchronisation, so the host clock
    // brackets the GPU's measured work to within one chunk's enqueue time.
    let measured_from_s = crate::clocks::now_s();
    let mut samples: Vec<f64> = Vec::new();
    let mut spent_ms = 0.0;
    loop {
        let s = run_chunk(&*wl)?;
        spent_ms += s.iter().sum::<f64>() * lps as f64 / 1000.0;
        samples.extend(s);
        if samples.len() >= cfg.max_reps
            || (samples.len() >= cfg.min_reps
                && (rel_spread(&samples) <= cfg.target_rel_spread || spent_ms >= cfg.budget_ms))
        {
            break;
        }
    }
    let measured_to_s = crate::clocks::now_s();
    gpu.check_async()?;
    Ok(Timing {
        samples_us: samples,
        weight_copies: copies,
        rotated_bytes: copies as u64 * wb,
        bytes_per_call: wl.bytes_per_call(),
        ops_per_call: wl.ops_per_call(),
        op_kind: wl.op_kind(),
        launches_per_sample: lps,
        launches: cfg.launches,
        blocks_per_sm: 0,
        regime,
        note,
        warmup_from_s,
        measured_from_s,
        measured_to_s,
    })
}

/// Captures `lps` calls of `wl` (weight copies in rotation from copy 0)
/// into a graph, with chained launches when `chained`.
fn capture_sample(
    gpu: &Gpu,
    wl: &dyn Timeable,
    lps: usize,
    chained: bool,
) -> Result<Graph, GpuError> {
    let copies = wl.weight_copies().max(1);
    capture(gpu, chained, || {
        (0..lps).try_for_each(|i| wl.enqueue(gpu, i % copies))
    })
    .map_err(|e| GpuError::Other(format!("capturing the sample's launches into a graph: {e}")))
}

/// Captures what `enqueue` puts on the stream into a graph, with chained
/// launches when `chained`. The capture is ended and chaining switched off
/// whatever happens, so a failed enqueue leaves the stream usable; the
/// graph is replayed once before it is returned (its first launch uploads
/// it).
fn capture(
    gpu: &Gpu,
    chained: bool,
    enqueue: impl FnOnce() -> Result<(), GpuError>,
) -> Result<Graph, GpuError> {
    gpu.synchronize()?;
    gpu.begin_capture()?;
    gpu.set_chained_launches(chained);
    let enqueued = enqueue();
    gpu.set_chained_launches(false);
    let graph = gpu.end_capture();
    enqueued?;
    let graph = graph?;
    graph.launch()?;
    gpu.synchronize()?;
    Ok(graph)
}

/// The median interval between consecutive events of `evs`, divided by
/// `per`, in us.
fn median_interval_us(evs: &[Event], per: f64) -> Result<f64, GpuError> {
    let mut t: Vec<f64> = evs
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(|x| x as f64 * 1000.0 / per))
        .collect::<Result<_, _>>()?;
    t.sort_by(f64::total_cmp);
    Ok(quantile_sorted(&t, 0.5))
}

/// Measured read-bandwidth ceilings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ceilings {
    /// Read-only stream over a buffer far larger than L2, GB/s (1e9 B/s).
    pub hbm_read_gbps: f64,
    /// Repeated read-only stream over an L2-resident buffer, GB/s.
    pub l2_read_gbps: f64,
    pub hbm_buffer_bytes: u64,
    pub l2_buffer_bytes: u64,
    /// Launch-latency floor: the time per launch of an empty kernel (the
    /// probe over zero bytes, one block per SM) enqueued back to back and
    /// bracketed the way `measure` brackets a sample, us. A call of k
    /// dependent launches cannot take less than k floors.
    #[serde(default)]
    pub launch_floor_us: f64,
    /// The same empty launches captured into a CUDA graph and replayed (the
    /// `graph` launch mode), us per launch; 0 when not measured.
    #[serde(default)]
    pub graph_launch_floor_us: f64,
    /// As `graph_launch_floor_us` with each launch a programmatic dependent
    /// of the one before (the `chained` mode).
    #[serde(default)]
    pub chained_launch_floor_us: f64,
}

impl Ceilings {
    /// The launch floor of a launch mode, us per launch (0: not measured).
    pub fn launch_floor_for(&self, mode: Launches) -> f64 {
        match mode {
            Launches::Stream => self.launch_floor_us,
            Launches::Graph => self.graph_launch_floor_us,
            Launches::Chained => self.chained_launch_floor_us,
        }
    }
}

/// HBM and L2 read bandwidth with the 16-byte-load stream kernel
/// (kernels/cuda/stream.cu); medians of 20 samples each.
pub fn measure_ceilings(gpu: &Gpu) -> Result<Ceilings, GpuError> {
    let text = crate::source::resolve("stream.cu").map_err(GpuError::Other)?;
    let d: Defines = [("THREADS".to_string(), DefineValue::Int(512))]
        .into_iter()
        .collect();
    let mut opts: Vec<String> = crate::compile::BASE_OPTIONS
        .iter()
        .map(|s| s.to_string())
        .collect();
    opts.push(format!("--gpu-architecture={}", gpu.arch()));
    opts.extend(crate::defines::to_options(&d).map_err(GpuError::Other)?);
    let cache = default_cache_dir();
    let cv = compile_source(
        "stream",
        "stream.cu",
        &text,
        &d,
        &opts,
        gpu.arch(),
        cache.as_deref(),
    )?;
    let module = gpu.load(&cv)?;
    let l2 = gpu.info().l2_bytes;
    let (free, _) = gpu.mem_info()?;
    let hbm_bytes = (8 * l2).max(1 << 30).min(free as u64 / 3) & !0xffff;
    let l2_bytes = (l2 / 3) & !0xffff;
    let big = gpu.alloc(hbm_bytes as usize)?;
    gpu.fill_u32(&big, 0x3c00_3c00)?;
    let sink = gpu.alloc(64)?;
    let blocks = gpu.info().sm_count * 4;
    let geo = LaunchGeometry {
        kernel: "stream_read".into(),
        grid: (blocks, 1, 1),
        block: (512, 1, 1),
        dyn_smem: 0,
    };
    let measure = |bytes: u64, reps: i32| -> Result<f64, GpuError> {
        let args = [
            big.arg(),
            KArg::U64(bytes / 16),
            KArg::I32(reps),
            sink.arg(),
        ];
        gpu.launch(&module, &geo, &args)?;
        let evs: Vec<_> = (0..21).map(|_| gpu.event()).collect::<Result<_, _>>()?;
        gpu.record(&evs[0])?;
        for e in &evs[1..] {
            gpu.launch(&module, &geo, &args)?;
            gpu.record(e)?;
        }
        let us = median_interval_us(&evs, 1.0)?;
        Ok(bytes as f64 * reps as f64 / (us * 1e-6) / 1e9)
    };
    let hbm = measure(hbm_bytes, 1)?;
    let l2bw = measure(l2_bytes, 40)?;
    // The launch floor: 200 empty launches per sample, median of 11.
    let floor_geo = LaunchGeometry {
        grid: (gpu.info().sm_count, 1, 1),
        ..geo.clone()
    };
    let empty = [big.arg(), KArg::U64(0), KArg::I32(1), sink.arg()];
    gpu.launch(&module, &floor_geo, &empty)?;
    let evs: Vec<_> = (0..12).map(|_| gpu.event()).collect::<Result<_, _>>()?;
    gpu.record(&evs[0])?;
    for e in &evs[1..] {
        for _ in 0..200 {
            gpu.launch(&module, &floor_geo, &empty)?;
        }
        gpu.record(e)?;
    }
    let launch_floor_us = median_interval_us(&evs, 200.0)?;
    // The same 200 empty launches captured into a graph, replayed 11 times:
    // plain, then chained.
    let graph_floor = |chained: bool| -> Result<f64, GpuError> {
        let graph = capture(gpu, chained, || {
            (0..200).try_for_each(|_| gpu.launch(&module, &floor_geo, &empty))
        })?;
        gpu.record(&evs[0])?;
        for e in &evs[1..] {
            graph.launch()?;
            gpu.record(e)?;
        }
        median_interval_us(&evs, 200.0)
    };
    let graph_launch_floor_us = graph_floor(false)?;
    let chained_launch_floor_us = graph_floor(true)?;
    gpu.check_async()?;
    Ok(Ceilings {
        hbm_read_gbps: hbm,
        l2_read_gbps: l2bw,
        hbm_buffer_bytes: hbm_bytes,
        l2_buffer_bytes: l2_bytes,
        launch_floor_us,
        graph_launch_floor_us,
        chained_launch_floor_us,
    })
}
