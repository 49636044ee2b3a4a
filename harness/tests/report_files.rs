//! Statistics, CSV schema round trip, PNG writing, summary and the tuned
//! table's promote round trip.

use gemtune::results::{self, CheckRow, TuneRow};
use gemtune::{plots, report, stats, tuned};

#[test]
fn quantiles_on_known_samples() {
    let s: Vec<f64> = (1..=11).map(|i| i as f64).collect(); // 1..11
    let m = stats::summarize(&s, 1);
    assert_eq!(m.n, 11);
    assert_eq!(m.median, 6.0);
    assert_eq!(m.p10, 2.0);
    assert_eq!(m.p90, 10.0);
    assert_eq!((m.min, m.max, m.mean), (1.0, 11.0, 6.0));
    // Unsorted input and an even count interpolate.
    assert_eq!(stats::median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
    // NaN samples are ignored.
    assert_eq!(stats::median(&[f64::NAN, 5.0, 7.0]), 6.0);
}

#[test]
fn bootstrap_ci_contains_the_median_and_is_deterministic() {
    let s: Vec<f64> = (0..200)
        .map(|i| 10.0 + ((i * 37) % 101) as f64 * 0.01)
        .collect();
    let med = stats::median(&s);
    let (lo, hi) = stats::bootstrap_median_ci(&s, 0.95, 2000, 42);
    assert!(lo <= med && med <= hi, "{lo} <= {med} <= {hi}");
    assert!(
        hi - lo < 0.5,
        "interval [{lo}, {hi}] is narrow for 200 samples"
    );
    assert_eq!(stats::bootstrap_median_ci(&s, 0.95, 2000, 42), (lo, hi));
    assert_ne!(stats::bootstrap_median_ci(&s, 0.95, 2000, 43), (lo, hi));
    assert_eq!(stats::bootstrap_median_ci(&[3.0], 0.95, 100, 1), (3.0, 3.0));
    let one = stats::summarize(&s, 7);
    assert_eq!(
        (one.ci_lo, one.ci_hi),
        stats::bootstrap_median_ci(&s, 0.95, stats::BOOTSTRAP_RESAMPLES, 7)
    );
}

fn tune_row(
    variant: &str,
    shape_m: usize,
    regime: &str,
    median: f64,
    regs: u32,
    bm: i64,
) -> TuneRow {
    TuneRow {
        schema_version: results::SCHEMA_VERSION,
        family: "mmq".into(),
        variant: variant.into(),
        hash: format!("{:08x}", median.to_bits() as u32),
        base: "pipelined".into(),
        defines: format!(
            "BM={bm} BN={} STAGES=3 WTYPE=Q8_0",
            64 + (regs as i64 % 2) * 64
        ),
        shape: format!("e4b.ffn_up@m={shape_m}"),
        shape_base: "e4b.ffn_up".into(),
        m: shape_m,
        n: 10240,
        k: 2560,
        wtype: "Q8_0".into(),
        regime: regime.into(),
        regime_label: "dram: 5 weight copies, 139264000 B rotated (2.7x L2)".into(),
        weight_copies: 5,
        rotated_bytes: 139_264_000,
        samples: 3,
        median_us: median,
        p10_us: median * 0.98,
        p90_us: median * 1.03,
        min_us: median * 0.97,
        mean_us: median * 1.001,
        ci_lo_us: median * 0.99,
        ci_hi_us: median * 1.01,
        bytes_per_call: 27_852_800,
        ops_per_call: 2 * shape_m as u64 * 10240 * 2560,
        op_kind: "intop".into(),
        gbps: 1234.5678901234567,
        tops: 0.1 + 1.0 / 3.0,
        roof: "mma.s8".into(),
        roof_time_us: median / 3.0,
        pct_of_roof: 100.0 / 3.0,
        intensity: 1.0 / 7.0,
        roof_why: "mma.s8 binds: 1882 op/B is above the ridge 418 op/B of mma.s8 over HBM".into(),
        hbm_gbps: 3100.25,
        l2_gbps: 7300.5,
        registers: regs,
        spill_bytes: 0,
        static_smem: 0,
        dyn_smem: 49152,
        launches_per_sample: 7,
        blocks_per_sm: 2,
        device: "NVIDIA H100 80GB HBM3".into(),
        cc: "9.0".into(),
        sm_count: 132,
        l2_bytes: 52_428_800,
        clock_mhz: 1980,
        mem_clock_mhz: 2619,
        driver_version: 13000,
        nvrtc_version: "13.0".into(),
        spec_sha256: "ab".repeat(32),
        source_sha256: "cd".repeat(32),
        timing_note: String::new(),
        samples_us: results::join_samples(&[median * 0.98, median, median * 1.03]),
    }
}

#[test]
fn results_csv_round_trips_at_full_precision() {
    let dir = tempfile::tempdir().unwrap();
    let rows = vec![
        tune_row("pipelined", 2048, "dram", 123.456_789_012_345_68, 128, 128),
        tune_row("baseline", 2048, "l2", 1e-7 / 3.0, 96, 64),
    ];
    let p = dir.path().join("results.csv");
    results::write_csv(&p, &rows).unwrap();
    let back: Vec<TuneRow> = results::read_csv(&p).unwrap();
    assert_eq!(back, rows);
    let header = std::fs::read_to_string(&p).unwrap();
    assert!(
        header.starts_with("schema_version,family,variant,hash,"),
        "{}",
        &header[..60]
    );
    assert_eq!(results::split_samples(&back[0].samples_us).len(), 3);

    let check = vec![CheckRow {
        schema_version: results::SCHEMA_VERSION,
        family: "gemv".into(),
        variant: "baseline".into(),
        hash: "0123abcd".into(),
        shape: "e4b.ffn_up@m=1".into(),
        m: 1,
        n: 10240,
        k: 2560,
        wtype: "Q8_0".into(),
        arch: "sm_90".into(),
        verdict: "pass".into(),
        reason: "ok, with a comma".into(),
        contract: "fp".into(),
        rms_rel: Some(1.234e-7),
        max_rel: None,
        max_abs: Some(0.5),
        outliers: Some(0),
        replay_rms_rel: None,
        unwritten: Some(0),
        non_finite: Some(0),
        registers: Some(40),
        spill_bytes: Some(0),
        static_smem: Some(0),
        dyn_smem: None,
        seed: Some(u64::MAX),
        defines: "ALGO=0 WTYPE=Q8_0".into(),
        nvrtc_version: "13.0".into(),
    }];
    let p = dir.path().join("check.csv");
    results::write_csv(&p, &check).unwrap();
    assert_eq!(results::read_csv::<CheckRow>(&p).unwrap(), check);
}

fn assert_png(p: &std::path::Path) {
    let bytes = std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    assert!(
        bytes.len() > 1000,
        "{} is {} bytes",
        p.display(),
        bytes.len()
    );
    assert_eq!(
        &bytes[..8],
        b"\x89PNG\r\n\x1a\n",
        "{} is not a PNG",
        p.display()
    );
}

#[test]
fn plots_write_valid_pngs() {
    let dir = tempfile::tempdir().unwrap();
    let mut rows = Vec::new();
    for (i, m) in [64usize, 512, 2048].into_iter().enumerate() {
        for regime in ["l2", "dram"] {
            rows.push(tune_row(
                "baseline",
                m,
                regime,
                100.0 * (i + 1) as f64,
                96,
                64,
            ));
            rows.push(tune_row(
                "pipelined",
                m,
                regime,
                60.0 * (i + 1) as f64,
                128,
                128,
            ));
            rows.push(tune_row(
                "pipelined+BM=64",
                m,
                regime,
                70.0 * (i + 1) as f64,
                127,
                64,
            ));
        }
    }
    let axes = vec![("mmq".to_string(), "BM".to_string(), "BN".to_string())];
    let files = report::write_plots(dir.path(), &rows, &axes).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["time.png", "roofline.png", "heatmap-mmq.png"]);
    for f in &files {
        assert_png(f);
    }
    // The plot module on its own.
    let p = dir.path().join("one.png");
    plots::line_panels(
        &p,
        "t",
        &[plots::Panel {
            title: "single point".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            log_y: false,
            series: vec![plots::Series {
                label: "a".into(),
                points: vec![plots::Pt {
                    x: 1.0,
                    y: 2.0,
                    lo: 1.5,
                    hi: 2.5,
                }],
            }],
            hline: Some(100.0),
        }],
    )
    .unwrap();
    assert_png(&p);

    let md = report::summary_md(&report::SummaryInput {
        title: "t".into(),
        device_block: vec![("device".into(), "NVIDIA H100 80GB HBM3".into())],
        rows: &rows,
        checks: &[],
        notes: vec![],
    });
    assert!(
        md.contains("| e4b.ffn_up@m=2048 | dram | `pipelined` | 180.00 |"),
        "{md}"
    );
    assert!(md.contains("| 300.00 | 1.67x |"), "{md}");
}

#[test]
fn promote_round_trips_with_tie_bands() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tuned/sm_90.toml");
    // pipelined (100 us, CI [99, 101]) and pipelined+BM=64 (100.5 us, CI
    // [99.495, 101.505]) overlap: a tie band of two; the one with fewer
    // registers is promoted. baseline (200 us) is out of the band.
    let rows = vec![
        tune_row("pipelined", 2048, "dram", 100.0, 128, 128),
        tune_row("pipelined+BM=64", 2048, "dram", 100.5, 120, 64),
        tune_row("baseline", 2048, "dram", 200.0, 90, 64),
        tune_row("baseline", 2048, "l2", 50.0, 90, 64),
    ];
    let winners = tuned::select_winners(&rows, "reports/x");
    assert_eq!(winners.len(), 2);
    let w = winners.iter().find(|w| w.regime == "dram").unwrap();
    assert_eq!(w.variant, "pipelined+BM=64");
    assert_eq!(w.tie_band, ["pipelined", "pipelined+BM=64"]);
    assert_eq!(w.best_median_us, 100.0);
    assert_eq!(w.defines.get("BM"), Some(&tuned::TunedDefine::Int(64)));
    assert_eq!(
        w.defines.get("WTYPE"),
        Some(&tuned::TunedDefine::Str("Q8_0".into()))
    );
    assert_eq!(w.provenance.device, "NVIDIA H100 80GB HBM3");
    assert_eq!(w.provenance.spec_sha256, "ab".repeat(32));

    let written = tuned::promote(&path, "sm_90", winners.clone()).unwrap();
    let back = tuned::read(&path).unwrap();
    assert_eq!(back, written);
    assert_eq!(back.entries.len(), 2);
    // Promoting again replaces entries with the same key and keeps others.
    let again = tuned::select_winners(&rows[3..], "reports/y");
    let merged = tuned::promote(&path, "sm_90", again).unwrap();
    assert_eq!(merged.entries.len(), 2);
    assert_eq!(
        merged
            .entries
            .iter()
            .find(|e| e.regime == "l2")
            .unwrap()
            .provenance
            .run,
        "reports/y"
    );
    assert_eq!(
        merged
            .entries
            .iter()
            .find(|e| e.regime == "dram")
            .unwrap()
            .provenance
            .run,
        "reports/x"
    );
}
