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
        kind: results::KIND_VARIANT.into(),
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
        problem: "matmul".into(),
        regime: regime.into(),
        regime_label: "dram: 5 weight copies, 139264000 B rotated (2.7x L2)".into(),
        verdict: results::VERDICT_TIMED.into(),
        reason: String::new(),
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
        launch_floor_us: 2.1,
        registers: regs,
        spill_bytes: 0,
        static_smem: 0,
        dyn_smem: 49152,
        launches_per_sample: 7,
        blocks_per_sm: 2,
        launches: "stream".into(),
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
        sm_clock_min_mhz: Some(1980),
        sm_clock_max_mhz: Some(1980),
        sm_clock_mean_mhz: Some(1980.0),
        mem_clock_min_mhz: Some(2619),
        mem_clock_max_mhz: Some(2619),
        temp_max_c: Some(51),
        power_max_w: Some(412.25),
        clock_samples: 9,
        clock_reasons: String::new(),
        clock_note: String::new(),
        samples_us: results::join_samples(&[median * 0.98, median, median * 1.03]),
        device_index: Some(0),
        pci_bus_id: "00000000:1B:00.0".into(),
    }
}

/// A vendor reference row at the same problem as `tune_row(_, m, regime, ..)`.
fn ref_row(name: &str, shape_m: usize, regime: &str, median: f64) -> TuneRow {
    let mut r = tune_row(name, shape_m, regime, median, 0, 0);
    r.kind = results::KIND_REFERENCE.into();
    r.family = "cublas".into();
    r.hash = String::new();
    r.base = String::new();
    r.defines = String::new();
    r.registers = 0;
    r.dyn_smem = 0;
    r.roof = if name.ends_with("int8") {
        "tc.s8"
    } else {
        "tc.bf16"
    }
    .into();
    r.reason = gemtune_kernels::reference::RefKind::from_name(name)
        .map(|k| k.note().to_string())
        .unwrap_or_default();
    r
}

/// A reference row that could not be timed.
fn untimed_ref(name: &str, shape_m: usize, regime: &str, verdict: &str, reason: &str) -> TuneRow {
    let mut r = ref_row(name, shape_m, regime, f64::NAN);
    r.verdict = verdict.into();
    r.reason = reason.into();
    r.samples = 0;
    r.samples_us = String::new();
    r.sm_clock_min_mhz = None;
    r.sm_clock_max_mhz = None;
    r.sm_clock_mean_mhz = None;
    r.clock_samples = 0;
    r
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
        header.starts_with("schema_version,kind,family,variant,hash,"),
        "{}",
        &header[..60]
    );
    assert_eq!(results::SCHEMA_VERSION, 4);
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
        problem: "matmul".into(),
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
        device_index: Some(1),
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
            series: vec![
                plots::Series {
                    label: "a".into(),
                    points: vec![plots::Pt {
                        x: 1.0,
                        y: 2.0,
                        lo: 1.5,
                        hi: 2.5,
                    }],
                    reference: false,
                },
                plots::Series {
                    label: "cublas-bf16 (reference)".into(),
                    points: vec![
                        plots::Pt {
                            x: 1.0,
                            y: 1.0,
                            lo: 0.9,
                            hi: 1.1,
                        },
                        plots::Pt {
                            x: 4.0,
                            y: 3.0,
                            lo: 2.9,
                            hi: 3.1,
                        },
                    ],
                    reference: true,
                },
            ],
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

#[test]
fn reference_and_untimed_rows_round_trip_and_schema_1_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("results.csv");
    let mut unsampled = tune_row("baseline", 512, "l2", 80.0, 96, 64);
    unsampled.sm_clock_min_mhz = None;
    unsampled.sm_clock_max_mhz = None;
    unsampled.sm_clock_mean_mhz = None;
    unsampled.power_max_w = None;
    let rows = vec![
        tune_row("pipelined", 2048, "dram", 100.0, 128, 128),
        ref_row("cublas-bf16", 2048, "dram", 42.0),
        unsampled,
    ];
    results::write_csv(&p, &rows).unwrap();
    assert_eq!(results::read_csv::<TuneRow>(&p).unwrap(), rows);

    let un = untimed_ref(
        "cublas-int8",
        2048,
        "dram",
        "unavailable",
        "libcublas.so.13 could not be loaded",
    );
    results::write_csv(&p, std::slice::from_ref(&un)).unwrap();
    let back: Vec<TuneRow> = results::read_csv(&p).unwrap();
    assert!(back[0].median_us.is_nan() && !back[0].is_timed() && back[0].is_reference());
    assert_eq!(
        (back[0].verdict.as_str(), back[0].reason.as_str()),
        ("unavailable", "libcublas.so.13 could not be loaded")
    );

    // A schema-1 file (no kind/verdict/clock columns) reads as timed variant
    // rows: write a v2 row, then drop the new columns.
    let row = tune_row("baseline", 64, "l2", 10.0, 96, 64);
    results::write_csv(&p, std::slice::from_ref(&row)).unwrap();
    let (head, rec) = {
        let mut r = csv::Reader::from_path(&p).unwrap();
        let h = r.headers().unwrap().clone();
        let rec = r.records().next().unwrap().unwrap();
        (h, rec)
    };
    let added = [
        "kind",
        "verdict",
        "reason",
        "sm_clock_min_mhz",
        "sm_clock_max_mhz",
        "sm_clock_mean_mhz",
        "mem_clock_min_mhz",
        "mem_clock_max_mhz",
        "temp_max_c",
        "power_max_w",
        "clock_samples",
        "clock_reasons",
        "clock_note",
    ];
    let keep: Vec<usize> = (0..head.len())
        .filter(|&i| !added.contains(&&head[i]))
        .collect();
    assert_eq!(keep.len(), head.len() - added.len());
    let mut w = csv::Writer::from_path(&p).unwrap();
    w.write_record(keep.iter().map(|&i| &head[i])).unwrap();
    w.write_record(keep.iter().map(|&i| &rec[i])).unwrap();
    w.flush().unwrap();
    drop(w);
    let v1: Vec<TuneRow> = results::read_csv(&p).unwrap();
    assert_eq!(v1[0].kind, "variant");
    assert_eq!(v1[0].verdict, "timed");
    assert_eq!(v1[0].sm_clock_min_mhz, None);
    assert_eq!(v1[0].median_us, 10.0);
}

#[test]
fn summary_judges_each_family_against_its_references() {
    let mut rows = vec![
        tune_row("pipelined", 2048, "dram", 100.0, 128, 128),
        tune_row("baseline", 2048, "dram", 200.0, 96, 64),
        tune_row("pipelined", 2048, "l2", 90.0, 128, 128),
        ref_row("cublas-bf16", 2048, "dram", 42.0),
        ref_row("cublas-int8", 2048, "dram", 45.0),
        untimed_ref(
            "cublas-bf16",
            2048,
            "l2",
            "unsupported",
            "cublas-bf16: cublasGemmEx returned CUBLAS_STATUS_NOT_SUPPORTED",
        ),
        untimed_ref("cublas-int8", 2048, "l2", "fail", "failed its oracle check"),
    ];
    // gemm_dq at the same problem is judged against cublas-bf16 only.
    let mut g = tune_row("dq", 2048, "dram", 60.0, 100, 128);
    g.family = "gemm_dq".into();
    g.op_kind = "flop".into();
    rows.push(g);
    // One throttled measurement.
    rows[1].sm_clock_min_mhz = Some(1650);
    rows[1].clock_reasons = "sw_power_cap".into();
    report::flag_throttled(&mut rows);
    assert!(
        rows[1].clock_note.contains("fell to 1650 MHz"),
        "{}",
        rows[1].clock_note
    );
    assert!(rows[1].clock_note.contains("(sw_power_cap)"));
    assert!(rows[0].clock_note.is_empty());

    let md = report::summary_md(&report::SummaryInput {
        title: "t".into(),
        device_block: vec![("device".into(), "NVIDIA H100 80GB HBM3".into())],
        rows: &rows,
        checks: &[],
        notes: vec![],
    });
    // mmq: the fastest of its two references (bf16, 42 us) over 100 us.
    assert!(md.contains("| 0.42x cublas-bf16 | 1980 |"), "{md}");
    // gemm_dq: bf16 only (42 / 60).
    assert!(md.contains("| 0.70x cublas-bf16 | 1980 |"), "{md}");
    // l2: no timed reference, the reason is shown.
    assert!(md.contains("| - (cublas-bf16 unsupported) |"), "{md}");
    // References are never the best variant of a family.
    assert!(!md.contains(
        "| `cublas-bf16` | 42.00 | [41.58, 42.42] | 1234 | 0.4 TFLOP/s | tc.bf16 | 33.3 | 1 |"
    ));
    assert!(md.contains("## Vendor references"), "{md}");
    assert!(
        md.contains("| e4b.ffn_up@m=2048 | dram | `cublas-bf16` | timed | 42.00 |"),
        "{md}"
    );
    assert!(
        md.contains("| e4b.ffn_up@m=2048 | l2 | `cublas-int8` | fail | - |"),
        "{md}"
    );
    assert!(md.contains("ignores the per-32 block scales"), "{md}");
    // Clocks: the range and the throttled row.
    assert!(md.contains("| SM | 1650-1980 MHz |"), "{md}");
    assert!(md.contains("Throttling: 1 rows fell more than 5%"), "{md}");
    assert!(
        md.contains("- mmq `baseline` e4b.ffn_up@m=2048 dram: SM clock fell to 1650 MHz"),
        "{md}"
    );

    // Winners never come from reference rows.
    let w = tuned::select_winners(&rows, "r");
    assert!(w.iter().all(|e| e.family != "cublas"));
    assert_eq!(
        w.iter()
            .find(|e| e.family == "mmq" && e.regime == "dram")
            .unwrap()
            .variant,
        "pipelined"
    );

    // Plots: reference series drawn apart, only in the panels of families
    // they apply to.
    let (time, roof) = report::panels(&rows);
    assert_eq!(time.len(), roof.len());
    let mmq_dram = time
        .iter()
        .find(|p| p.title == "mmq e4b.ffn_up [dram]")
        .unwrap();
    let refs: Vec<&str> = mmq_dram
        .series
        .iter()
        .filter(|s| s.reference)
        .map(|s| s.label.as_str())
        .collect();
    assert_eq!(refs, ["cublas-bf16 (reference)", "cublas-int8 (reference)"]);
    let dq = time
        .iter()
        .find(|p| p.title == "gemm_dq e4b.ffn_up [dram]")
        .unwrap();
    assert_eq!(dq.series.iter().filter(|s| s.reference).count(), 1);
    assert!(time.iter().all(|p| !p.title.starts_with("cublas")));
    let dir = tempfile::tempdir().unwrap();
    for f in report::write_plots(dir.path(), &rows, &[]).unwrap() {
        assert_png(&f);
    }
}

#[test]
fn summary_says_when_clocks_were_not_sampled() {
    let mut r = tune_row("baseline", 64, "l2", 10.0, 96, 64);
    r.sm_clock_min_mhz = None;
    r.sm_clock_max_mhz = None;
    let md = report::summary_md(&report::SummaryInput {
        title: "t".into(),
        device_block: vec![],
        rows: &[r],
        checks: &[],
        notes: vec![],
    });
    assert!(md.contains("## Clocks\n\nNot sampled"), "{md}");
    assert!(md.contains("| - | - |"), "{md}");
}
