//! The cubin's resource attributes agree with the ptxas log on a sample of
//! the real sweep points of every family (`variants/<family>.toml`, expanded
//! as `check` and `tune` expand them), for sm_80, sm_89 and sm_90. The
//! defaults are covered in the kernels crate; this adds the variety of tile
//! shapes, unrolls and pipelines the specs actually sweep. No GPU needed;
//! NVRTC must be loadable (CI installs it from PyPI).

use gemtune::spec::{self, Point};
use gemtune_kernels::compile::{compile, nvrtc_available, parse_ptxas_log, Arch, ResourceSource};
use gemtune_kernels::cubin::{entry_names, Cubin};
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::families;
use rayon::prelude::*;

/// Points per family: every named variant, plus this many sweep points
/// spread evenly over the sweeps.
const SWEEP_SAMPLE: usize = 4;

fn sample(points: &[Point]) -> Vec<&Point> {
    let fresh: Vec<&Point> = points.iter().filter(|p| p.duplicate_of.is_none()).collect();
    let (named, swept): (Vec<&Point>, Vec<&Point>) = fresh.into_iter().partition(|p| p.named);
    let step = swept.len().div_ceil(SWEEP_SAMPLE).max(1);
    named
        .into_iter()
        .chain(swept.into_iter().step_by(step))
        .collect()
}

#[test]
fn cubin_resources_match_ptxas_on_swept_variants() {
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc.so) cannot be loaded: run `. scripts/nvrtc-env.sh` first"
    );
    let vdir = spec::variants_dir(None);
    let mut jobs = Vec::new();
    for f in families() {
        let (spec, f) =
            spec::load_family(&vdir, f.name()).unwrap_or_else(|e| panic!("{}: {e}", f.name()));
        let declared = f.declared_defines();
        let points = spec::expand(&spec);
        for (i, p) in sample(&points).into_iter().enumerate() {
            let mut d = p.defines.clone();
            // Alternate the weight type, as shapes would bind it.
            if declared.iter().any(|x| x == "WTYPE") {
                let wt = if i % 2 == 0 { "Q8_0" } else { "Q4_0" };
                d.insert("WTYPE".into(), DefineValue::Str(wt.into()));
            }
            // Likewise the K/V type and head dim of attention shapes.
            if declared.iter().any(|x| x == "KV_TYPE") {
                let kv = ["F16", "BF16", "F32"][i % 3];
                d.insert("KV_TYPE".into(), DefineValue::Str(kv.into()));
            }
            if declared.iter().any(|x| x == "HEAD_DIM") {
                let hd = if i % 2 == 0 { 256 } else { 512 };
                d.insert("HEAD_DIM".into(), DefineValue::Int(hd));
            }
            for arch in [Arch(80), Arch(89), Arch(90)] {
                if f.arch_specific_for(&d).is_some_and(|a| a != arch) {
                    continue;
                }
                jobs.push((f, p.id.clone(), d.clone(), arch));
            }
        }
    }
    let outcomes: Vec<Result<usize, String>> = jobs
        .par_iter()
        .map(|(f, id, d, arch)| {
            let what = format!("{arch} {} {id}", f.name());
            let cv = match compile(*f, d, *arch, None) {
                Ok(cv) => cv,
                // Compile failures of spec points are `check`'s business;
                // they are listed, not judged, here.
                Err(e) => {
                    println!("SKIP {what}: {e}");
                    return Ok(0);
                }
            };
            if cv.resources_source != ResourceSource::PtxasLog {
                println!("SKIP {what}: no complete ptxas log to compare with");
                return Ok(0);
            }
            let c = Cubin::parse(&cv.cubin).map_err(|e| format!("{what}: {e}"))?;
            let log = parse_ptxas_log(&cv.log);
            let mut diffs = c.differences(&log);
            if c.sm != arch.0 {
                diffs.push(format!("e_flags say sm_{}", c.sm));
            }
            let names = entry_names(&cv.cubin).map_err(|e| format!("{what}: {e}"))?;
            if names.len() != log.len() {
                diffs.push(format!(
                    "{} entries vs {} in the log",
                    names.len(),
                    log.len()
                ));
            }
            if diffs.is_empty() {
                Ok(c.kernels.len())
            } else {
                Err(format!("{what}: {diffs:?}"))
            }
        })
        .collect();
    let failures: Vec<&String> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert!(failures.is_empty(), "{failures:#?}");
    let kernels: usize = outcomes.iter().filter_map(|o| o.as_ref().ok()).sum();
    println!("{} compiles, {kernels} kernels compared", jobs.len());
    // Skips are allowed point by point, never for a whole family.
    for f in families() {
        let compared: usize = jobs
            .iter()
            .zip(&outcomes)
            .filter(|((g, ..), _)| g.name() == f.name())
            .filter_map(|(_, o)| o.as_ref().ok())
            .sum();
        assert!(compared > 0, "no {} kernel was compared", f.name());
    }
}
