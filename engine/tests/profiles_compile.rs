//! Every committed profile, with the committed tuned table, resolves every
//! launch the CUDA forward makes to a kernel variant that compiles through
//! NVRTC for sm_80, sm_89 and sm_90 without spills: on every synthetic
//! model shape (tiny, e2b, e4b, 12b, 31b) in q8_0, q4_0, the k-quant mixes
//! q4_k_m, q5_k_m, q6_k, and f16 and bf16 (each matrix in the file's own
//! type, as the engine reads it), at the decode row counts and the default
//! prefill chunk. No GPU needed; NVRTC must be
//! loadable (CI installs it from PyPI).
//!
//! Hopper-only choices (wgmma) must fall back on sm_80/sm_89 through the
//! profile's named fallback; a choice that cannot run anywhere fails here.

use std::collections::BTreeMap;

use gemtune_engine::cuda::forward_plan::{ForwardPlan, PlannedLaunch, Sizing};

use gemtune_engine::cuda::model_dims::ModelDims;
use gemtune_engine::cuda::slots::Slot;
use gemtune_engine::cuda::{Planner, BUILTIN_TUNED, DEFAULT_UBATCH};
use gemtune_engine::profile::{Profile, BUILTIN};
use gemtune_engine::synth::{self, SynthVariant, WeightType};
use gemtune_engine::tuned::TunedFile;
use gemtune_kernels::compile::{compile, nvrtc_available, Arch};
use gemtune_kernels::defines::canonical;
use gemtune_kernels::family::{family, DeviceLimits, KvType};
use rayon::prelude::*;

#[test]
fn every_profile_compiles_for_every_arch_on_every_model_shape() {
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc.so) cannot be loaded: source scripts/nvrtc-env.sh (installs nvidia-cuda-nvrtc from PyPI)"
    );
    let tuned_90 = TunedFile::parse("builtin:sm_90", BUILTIN_TUNED[0].1).expect("tuned table");
    let models = [
        SynthVariant::Tiny,
        SynthVariant::E2b,
        SynthVariant::E4b,
        SynthVariant::B12,
        SynthVariant::B31,
    ];
    for arch in [Arch(80), Arch(89), Arch(90)] {
        // (family, defines) -> where it was first needed.
        let mut todo: BTreeMap<(String, String), (String, gemtune_kernels::defines::Defines)> =
            BTreeMap::new();
        for (pname, _) in BUILTIN {
            let profile = Profile::load(pname).expect("profile");
            let tuned = (arch == Arch(90)).then(|| tuned_90.clone());
            let planner = Planner::new(profile.clone(), tuned, DeviceLimits::for_arch(arch));
            let kv = match &profile.kv_type {
                Some(s) => KvType::from_name(s).expect("kv type"),
                None => KvType::F16,
            };
            for v in models {
                let cfg = synth::preset(v);
                for wt in [
                    WeightType::Q8_0,
                    WeightType::Q4_0,
                    WeightType::Q4KM,
                    WeightType::Q5KM,
                    WeightType::Q6K,
                    WeightType::F16,
                    WeightType::Bf16,
                ] {
                    // The file's own tensor types (the k-quant mixes'
                    // Q6_K attn_v/ffn_down, their BF16 PLE projection).
                    let dims = ModelDims::of_synth(&cfg, wt, &planner);
                    let max_seq = 8192.min(cfg.context_length);
                    let sizing = Sizing {
                        max_seq,
                        ubatch: DEFAULT_UBATCH.min(max_seq),
                        kv_type: kv,
                    };
                    let plan =
                        ForwardPlan::resolve(&planner, &cfg, &dims, sizing).unwrap_or_else(|e| {
                            panic!("{arch} profile {pname} {} {}: {e}", v.name(), wt.name())
                        });
                    for l in &plan.launches {
                        let (fam, d) = (l.res.family, &l.res.defines);
                        todo.entry((fam.name().to_string(), canonical(d)))
                            .or_insert_with(|| {
                                (
                                    format!(
                                        "profile {pname}, {} {}, slot {} ({})",
                                        v.name(),
                                        wt.name(),
                                        l.slot,
                                        l.problem.describe()
                                    ),
                                    d.clone(),
                                )
                            });
                    }
                }
            }
        }
        eprintln!("{arch}: {} distinct variants to compile", todo.len());
        // NVRTC compiles are independent: one per core.
        let failures: Vec<String> = todo
            .par_iter()
            .filter_map(|((fname, _), (why, d))| {
                let f = family(fname).expect("registered family");
                let cv = match compile(f, d, arch, None) {
                    Ok(cv) => cv,
                    Err(e) => return Some(format!("{arch} {why}: {e}")),
                };
                cv.functions
                    .iter()
                    .find(|func| func.spill_bytes != 0)
                    .map(|func| {
                        format!(
                            "{arch} {why}: {} spills {} bytes",
                            func.name, func.spill_bytes
                        )
                    })
            })
            .collect();
        assert!(failures.is_empty(), "{failures:#?}");
    }
}

/// Every launch of the synthetic Q8_0 `v` at `rows` rows under `planner`
/// (cache up to 8192 positions, prefill chunks of `ubatch`).
fn q8_0_launches(
    planner: &Planner,
    v: SynthVariant,
    rows: usize,
    ubatch: usize,
) -> Vec<PlannedLaunch> {
    let cfg = synth::preset(v);
    let wt = WeightType::Q8_0;
    let dims = ModelDims::from_config(
        &cfg,
        wt.matrix_type(),
        wt.embedding_type(cfg.d_model as u64),
        planner,
    );
    let max_seq = 8192.min(cfg.context_length);
    let sizing = Sizing {
        max_seq,
        ubatch,
        kv_type: KvType::F16,
    };
    let plan = ForwardPlan::resolve(planner, &cfg, &dims, sizing).expect("plan");
    let bucket = plan.bucket(rows).expect("a bucket");
    assert_eq!(bucket.rows, rows, "{rows} rows is a bucket bound");
    bucket
        .launches
        .iter()
        .map(|&id| plan.launches[id].clone())
        .collect()
}

/// `decode-km`'s full-layer decode slot resolves through its fallback
/// chain: the 8-row key-major tile where the GQA group fits (E4B), the
/// 16-row one for 12B's 16-head group on sm_90, and on sm_89 (no bulk
/// copies, and too little shared memory for stream-qs at 12B) main's own
/// fallback, the tile loop.
#[test]
fn decode_km_picks_its_full_layer_kernel_by_gqa_group_and_device() {
    let profile = Profile::load("decode-km").expect("profile");
    let served = |v: SynthVariant, arch: u32| -> (i64, i64) {
        let planner = Planner::new(profile.clone(), None, DeviceLimits::for_arch(Arch(arch)));
        let launches = q8_0_launches(&planner, v, 1, 512);
        let c = launches
            .iter()
            .find(|c| c.slot == Slot::from_name("attn_decode.full").expect("slot"))
            .expect("a full-layer decode call");
        let d = &c.res.defines;
        let int = |k: &str| gemtune_kernels::defines::get_int(d, k).expect(k);
        println!("{} sm_{arch}: {}", v.name(), c.res.why);
        (int("ALGO"), int("BQ"))
    };
    assert_eq!(served(SynthVariant::E4b, 90), (3, 8));
    assert_eq!(served(SynthVariant::B12, 90), (3, 16));
    assert_eq!(served(SynthVariant::B12, 89), (1, 16));
}

/// The prefill attention's I/O follows the variant the slot resolves to:
/// on sm_90 the wgmma kernel writes O in the output projection's format
/// (main's GEMM reads DQ_F16) and, under `flash-swa`, reads 16-bit Q, which
/// `qk_norm_rope` is bound to write; below sm_90 the `mma.sync` fallback
/// reads and writes f32, and so does decode everywhere.
#[test]
fn attention_io_follows_the_resolved_variant() {
    use gemtune_kernels::bind::ActFormat;
    use gemtune_kernels::defines::DefineValue;
    let io = |profile: &str, arch: u32, rows: usize| {
        let planner = Planner::new(
            Profile::load(profile).expect("profile"),
            None,
            DeviceLimits::for_arch(Arch(arch)),
        );
        let launches = q8_0_launches(&planner, SynthVariant::E4b, rows, DEFAULT_UBATCH);
        let bound = |slot: &str, key: &str| {
            let c = launches
                .iter()
                .find(|c| c.slot.name() == slot)
                .unwrap_or_else(|| panic!("{profile} sm_{arch}: no {slot} call"));
            c.bound
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{slot}: {key} not bound"))
        };
        let attn = if rows > 8 {
            "attn_prefill.swa"
        } else {
            "attn_decode.swa"
        };
        (bound(attn, "OUT"), bound("qk_norm_rope", "Q16"))
    };
    let dq = DefineValue::Str(ActFormat::DqF16.define().into());
    let f32 = DefineValue::Str(ActFormat::F32.define().into());
    let (yes, no) = (DefineValue::Int(1), DefineValue::Int(0));
    assert_eq!(io("main", 90, 2048), (dq.clone(), no.clone()));
    assert_eq!(io("flash-swa", 90, 2048), (dq, yes));
    assert_eq!(io("flash-swa", 89, 2048), (f32.clone(), no.clone()));
    assert_eq!(io("flash-swa", 90, 1), (f32, no));
}
