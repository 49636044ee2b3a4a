//! The rows of a `tune` report: what every row of a run shares, who a row
//! is about (a variant or a vendor reference), and a row from a timing (its
//! statistics, derived figures, roof and clocks) or from none.

use gemtune::references::RefJob;
use gemtune::results::{join_samples, TuneRow, KIND_REFERENCE};
use gemtune::roofline::{self, DevicePeaks, Instr};
use gemtune::spec::Shape;
use gemtune::stats;
use gemtune_kernels::clocks::{reason_names, ClockSampler};
use gemtune_kernels::gpu::DeviceInfo;
use gemtune_kernels::timing::{Ceilings, Launches, Regime, Timing};
use gemtune_kernels::workload::OpKind;
use std::time::Duration;

/// NVML polling period: most cells measure for tens of ms and see several
/// polls; the shortest (a few ms) read the last poll of their warm-up
/// (`clocks::select_window`). Polls are a few driver queries each, far
/// apart enough not to disturb the GPU.
pub(super) const CLOCK_PERIOD: Duration = Duration::from_millis(10);

/// What every row of one run shares.
pub(super) struct RunCtx<'a> {
    pub info: &'a DeviceInfo,
    pub ceil: &'a Ceilings,
    pub peaks: Option<&'static DevicePeaks>,
    pub nvrtc: String,
    pub seed: u64,
    pub sampler: Option<&'a ClockSampler>,
    pub launches: Launches,
}

/// Who a row is about: a variant of a family, or a vendor reference.
pub(super) struct Ident<'a> {
    pub kind: &'static str,
    pub family: String,
    pub variant: String,
    pub hash: String,
    pub base: String,
    pub defines: String,
    pub shape: &'a Shape,
    pub spec_sha256: String,
    pub source_sha256: String,
    /// Resources of the launch (registers, spill bytes, static and dynamic
    /// shared memory); zero for a vendor library.
    pub resources: (u32, u32, u32, u32),
    pub instr: Instr,
    pub reason: String,
}

fn rname(regime: Regime) -> &'static str {
    match regime {
        Regime::L2 => "l2",
        Regime::Dram => "dram",
    }
}

/// A row with no measurement: NaN statistics, the verdict and reason.
pub(super) fn untimed_row(
    cx: &RunCtx<'_>,
    id: Ident<'_>,
    regime: Regime,
    verdict: &str,
    reason: String,
) -> TuneRow {
    let nan = f64::NAN;
    let s = id.shape;
    TuneRow {
        schema_version: gemtune::results::SCHEMA_VERSION,
        kind: id.kind.to_string(),
        family: id.family,
        variant: id.variant,
        hash: id.hash,
        base: id.base,
        defines: id.defines,
        shape: s.name.clone(),
        shape_base: s.base.clone(),
        m: s.m,
        n: s.n,
        k: s.k,
        wtype: s.wtype_define(),
        problem: s.problem.describe(),
        regime: rname(regime).to_string(),
        regime_label: String::new(),
        verdict: verdict.to_string(),
        reason,
        weight_copies: 0,
        rotated_bytes: 0,
        samples: 0,
        median_us: nan,
        p10_us: nan,
        p90_us: nan,
        min_us: nan,
        mean_us: nan,
        ci_lo_us: nan,
        ci_hi_us: nan,
        bytes_per_call: 0,
        ops_per_call: 2 * (s.m * s.n * s.k) as u64,
        op_kind: String::new(),
        gbps: nan,
        tops: nan,
        roof: String::new(),
        roof_time_us: nan,
        pct_of_roof: nan,
        intensity: nan,
        roof_why: String::new(),
        hbm_gbps: cx.ceil.hbm_read_gbps,
        l2_gbps: cx.ceil.l2_read_gbps,
        launch_floor_us: cx.ceil.launch_floor_for(cx.launches),
        registers: id.resources.0,
        spill_bytes: id.resources.1,
        static_smem: id.resources.2,
        dyn_smem: id.resources.3,
        launches_per_sample: 0,
        blocks_per_sm: 0,
        launches: cx.launches.name().to_string(),
        device: cx.info.name.clone(),
        cc: format!("{}.{}", cx.info.cc.0, cx.info.cc.1),
        sm_count: cx.info.sm_count,
        l2_bytes: cx.info.l2_bytes,
        clock_mhz: cx.info.clock_mhz,
        mem_clock_mhz: cx.info.mem_clock_mhz,
        driver_version: cx.info.driver_version,
        nvrtc_version: cx.nvrtc.clone(),
        spec_sha256: id.spec_sha256,
        source_sha256: id.source_sha256,
        timing_note: String::new(),
        sm_clock_min_mhz: None,
        sm_clock_max_mhz: None,
        sm_clock_mean_mhz: None,
        mem_clock_min_mhz: None,
        mem_clock_max_mhz: None,
        temp_max_c: None,
        power_max_w: None,
        clock_samples: 0,
        clock_reasons: String::new(),
        clock_note: String::new(),
        samples_us: String::new(),
        device_index: Some(cx.info.ordinal),
        pci_bus_id: cx.info.pci_bus_id.clone(),
    }
}

/// A measured row: statistics, derived figures, the roof, the clocks.
pub(super) fn timed_row(cx: &RunCtx<'_>, id: Ident<'_>, t: &Timing) -> TuneRow {
    let regime = t.regime;
    let info = cx.info;
    let instr = id.instr;
    let reason = id.reason.clone();
    let mut row = untimed_row(cx, id, regime, gemtune::results::VERDICT_TIMED, reason);
    let sm = stats::summarize(&t.samples_us, cx.seed);
    let secs = sm.median * 1e-6;
    let fits_l2 = t.bytes_per_call <= info.l2_bytes;
    let (bw_label, bw) = match regime {
        Regime::L2 if fits_l2 => ("L2", cx.ceil.l2_read_gbps),
        _ => ("HBM", cx.ceil.hbm_read_gbps),
    };
    let compute = cx
        .peaks
        .and_then(|pk| pk.rate(instr))
        .map(|r| (instr.label(), r));
    let v = roofline::verdict(
        t.bytes_per_call,
        t.ops_per_call,
        sm.median,
        bw_label,
        bw,
        compute,
    );
    row.regime_label = match regime {
        Regime::L2 => format!(
            "l2: same buffers every call; {} B per call {} the {} B L2",
            t.bytes_per_call,
            if fits_l2 { "fits in" } else { "exceeds" },
            info.l2_bytes
        ),
        Regime::Dram => format!(
            "dram: {} weight copies, {} B rotated ({:.1}x L2){}",
            t.weight_copies,
            t.rotated_bytes,
            t.rotated_bytes as f64 / info.l2_bytes.max(1) as f64,
            if t.note.is_empty() {
                String::new()
            } else {
                format!("; {}", t.note)
            }
        ),
    };
    row.weight_copies = t.weight_copies;
    row.rotated_bytes = t.rotated_bytes;
    row.samples = sm.n;
    row.median_us = sm.median;
    row.p10_us = sm.p10;
    row.p90_us = sm.p90;
    row.min_us = sm.min;
    row.mean_us = sm.mean;
    row.ci_lo_us = sm.ci_lo;
    row.ci_hi_us = sm.ci_hi;
    row.bytes_per_call = t.bytes_per_call;
    row.ops_per_call = t.ops_per_call;
    row.op_kind = match t.op_kind {
        OpKind::Flop => "flop".into(),
        OpKind::IntOp => "intop".into(),
    };
    row.gbps = t.bytes_per_call as f64 / secs / 1e9;
    row.tops = t.ops_per_call as f64 / secs / 1e12;
    row.roof = v.roof;
    row.roof_time_us = v.roof_time_us;
    row.pct_of_roof = v.pct_of_roof;
    row.intensity = v.intensity;
    row.roof_why = v.why;
    row.launches_per_sample = t.launches_per_sample;
    row.launches = t.launches.name().to_string();
    row.blocks_per_sm = t.blocks_per_sm;
    row.timing_note = t.note.clone();
    row.samples_us = join_samples(&t.samples_us);
    if let Some(w) = cx
        .sampler
        .and_then(|c| c.window(t.warmup_from_s, t.measured_from_s, t.measured_to_s))
    {
        row.sm_clock_min_mhz = Some(w.sm_min_mhz);
        row.sm_clock_max_mhz = Some(w.sm_max_mhz);
        row.sm_clock_mean_mhz = Some(w.sm_mean_mhz);
        row.mem_clock_min_mhz = Some(w.mem_min_mhz);
        row.mem_clock_max_mhz = Some(w.mem_max_mhz);
        row.temp_max_c = w.temp_max_c;
        row.power_max_w = w.power_max_w;
        row.clock_samples = w.samples;
        row.clock_reasons = reason_names(w.reasons);
    }
    row
}

pub(super) fn ref_ident(j: &RefJob) -> Ident<'_> {
    Ident {
        kind: KIND_REFERENCE,
        family: j.kind.library().to_string(),
        variant: j.kind.name().to_string(),
        hash: String::new(),
        base: String::new(),
        defines: String::new(),
        shape: &j.shape,
        spec_sha256: String::new(),
        source_sha256: String::new(),
        resources: (0, 0, 0, 0),
        instr: roofline::instr_of_reference(j.kind.name()),
        reason: String::new(),
    }
}
