//! The plan resolved on the CPU for every committed profile and synthetic
//! model: buckets, launch reuse, prefill grids, per-type plans, the layouts
//! uploaded and the conversions refused.

use std::collections::HashMap;

use super::*;
use crate::cuda::model_dims::model_bytes;
use crate::profile::{DecodeLaunch, Profile};
use crate::synth::{self, SynthVariant, WeightType};
use gemtune_kernels::bind::matmul::TailMode;
use gemtune_kernels::bind::ActFormat;
use gemtune_kernels::compile::Arch;
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::DeviceLimits;
use gemtune_kernels::family::KvType;
use gemtune_kernels::quant::GgmlType;

fn plan(profile: &str, v: SynthVariant, ubatch: usize) -> (ForwardPlan, Planner) {
    let planner = Planner::new(
        Profile::load(profile).expect("profile"),
        None,
        DeviceLimits::for_arch(Arch(90)),
    );
    let cfg = synth::preset(v);
    let wt = WeightType::Q8_0;
    let dims = ModelDims::from_config(
        &cfg,
        wt.matrix_type(),
        wt.embedding_type(cfg.d_model as u64),
        &planner,
    );
    let sizing = Sizing {
        max_seq: 4096.min(cfg.context_length),
        ubatch,
        kv_type: KvType::F16,
    };
    let p = ForwardPlan::resolve(&planner, &cfg, &dims, sizing).expect("plan");
    (p, planner)
}

/// The sm_90 plan of `profile` for a synthetic model of `cfg` in `w`
/// (4096 positions, 512-token chunks), with its shapes.
fn synth_plan(
    profile: &str,
    cfg: &Gemma4Config,
    w: WeightType,
    what: &str,
) -> (ForwardPlan, ModelDims) {
    synth_plan_of(Profile::load(profile).expect("profile"), cfg, w, what)
}

/// The plan of a synthetic model of `cfg` in `w` under `profile` (sm_90,
/// 4096 positions, ubatch 512, f16 cache), or why it cannot be made.
fn resolve_synth(
    profile: Profile,
    cfg: &Gemma4Config,
    w: WeightType,
) -> Result<(ForwardPlan, ModelDims), PlanError> {
    let planner = Planner::new(profile, None, DeviceLimits::for_arch(Arch(90)));
    let dims = ModelDims::of_synth(cfg, w, &planner);
    let sizing = Sizing {
        max_seq: 4096,
        ubatch: 512,
        kv_type: KvType::F16,
    };
    ForwardPlan::resolve(&planner, cfg, &dims, sizing).map(|plan| (plan, dims))
}

/// `synth_plan` for a profile already read.
fn synth_plan_of(
    profile: Profile,
    cfg: &Gemma4Config,
    w: WeightType,
    what: &str,
) -> (ForwardPlan, ModelDims) {
    resolve_synth(profile, cfg, w).unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn buckets_cover_every_chunk_length() {
    let (p, _) = plan("main", SynthVariant::E4b, 512);
    for t in 1..=512 {
        let b = p.bucket(t).expect("a bucket");
        assert!(b.rows >= t, "{t} rows in a bucket of {}", b.rows);
        if t <= GEMV_MAX_ROWS {
            assert_eq!(b.rows, t);
            assert!(b.head.is_some());
        } else {
            assert!(b.head.is_none());
        }
    }
    assert!(p.bucket(0).is_none() && p.bucket(513).is_none());
}

#[test]
fn every_bucket_plans_every_layer_and_each_launch_is_resolved_once() {
    let (p, planner) = plan("main", SynthVariant::E2b, 2048);
    let cfg = synth::preset(SynthVariant::E2b);
    assert_eq!(p.lookups, planner.lookups());
    for b in &p.buckets {
        assert_eq!(b.layers.len(), cfg.n_layers);
        assert!(b.per_layer_inputs.is_some(), "E2B has per-layer inputs");
        for (l, lp) in b.layers.iter().enumerate() {
            assert_eq!(lp.ple.is_some(), cfg.ple_dim > 0);
            // The layer's end is a launch (with the next layer's input
            // norm where a layer follows), or the tail of its last
            // projection, in decode buckets only.
            let last = lp.ple.as_ref().map_or(&lp.down, |pp| &pp.proj);
            if last.tail() == TailMode::None {
                assert!(lp.end.is_some());
                assert_eq!(lp.end_with_next_norm.is_some(), l + 1 < cfg.n_layers);
            } else {
                assert!(lp.end.is_none() && lp.end_with_next_norm.is_none());
                assert!(b.rows <= GEMV_MAX_ROWS);
            }
            // The MoE modes of the norm stay off on a dense model.
            assert!(lp.moe.is_none());
            for id in [lp.attn_residual, lp.end, lp.end_with_next_norm]
                .into_iter()
                .flatten()
            {
                let d = &p.launches[id].res.defines;
                assert_eq!(d.get("SUM_IN"), Some(&DefineValue::Int(0)));
                assert_eq!(d.get("OUTS"), Some(&DefineValue::Int(1)));
            }
        }
    }
    let mut keys = BTreeSet::new();
    for l in &p.launches {
        assert!(keys.insert((
            l.slot,
            l.problem.describe(),
            format!("{:?}", l.bound),
            format!("{:?}", l.entry),
            format!("{:?}", l.grid)
        )));
    }
}

#[test]
fn prefill_geometry_follows_the_chunk_rows() {
    let (p, _) = plan("main", SynthVariant::E4b, 2048);
    let b = p.bucket(2048).expect("bucket");
    for &id in &b.launches {
        let l = &p.launches[id];
        let full = l.geometry_at(2048, &p).expect("geometry at the bound");
        assert_eq!(full.grid, l.res.geo.grid, "{}", l.slot);
        let small = l.geometry_at(100, &p).expect("geometry at 100 rows");
        if l.grid != GridRule::Fixed {
            let (a, z) = (full.grid, small.grid);
            assert!(
                a.0 as u64 * a.1 as u64 * a.2 as u64 >= z.0 as u64 * z.1 as u64 * z.2 as u64,
                "{}: {a:?} at 2048 rows, {z:?} at 100",
                l.slot
            );
        }
    }
}

/// Synthetic E4B and 12B files in the k-quant mixes and the 16-bit
/// types plan under `main` and `strict` with every projection read in
/// its file type and nothing converted: a Q|K|V whose parts' types
/// differ (the mixes' Q6_K `attn_v` beside Q4_K/Q5_K Q and K) is planned
/// as one launch per run of one type. The device bytes follow the
/// layouts each profile reads.
#[test]
fn kquant_and_16bit_files_plan_their_own_types() {
    use crate::synth::mix;
    for v in [SynthVariant::E4b, SynthVariant::B12] {
        let cfg = synth::preset(v);
        let specs = crate::plan::tensor_plan(&cfg);
        for w in [
            WeightType::Q4KM,
            WeightType::Q5KM,
            WeightType::Q6K,
            WeightType::F16,
            WeightType::Bf16,
        ] {
            let types = mix::tensor_types(&specs, cfg.n_layers, w);
            let ty: HashMap<&str, GgmlType> = specs
                .iter()
                .map(|s| s.name.as_str())
                .zip(types.iter().copied())
                .collect();
            for profile in ["main", "strict"] {
                let what = format!("{} {} {profile}", v.name(), w.name());
                let (plan, dims) = synth_plan(profile, &cfg, w, &what);
                let name = |l: usize, s: &str| crate::plan::layer_tensor_name(l, s);
                let mut mixed = 0;
                for (l, ld) in dims.layers.iter().enumerate() {
                    for (dim, part) in [
                        (ld.o, "attn_output"),
                        (ld.gate_up, "ffn_gate"),
                        (ld.gate_up, "ffn_up"),
                        (ld.down, "ffn_down"),
                    ] {
                        assert_eq!(dim.2, ty[name(l, part).as_str()], "{what} {l} {part}");
                    }
                    let qkv: Vec<GgmlType> = ["attn_q", "attn_k", "attn_v"]
                        .iter()
                        .filter(|p| cfg.layers[l].owns_kv() || **p == "attn_q")
                        .filter_map(|p| ty.get(name(l, p).as_str()).copied())
                        .collect();
                    // One run per change of type along Q, K, V, each
                    // in its parts' own type.
                    let mut want: Vec<GgmlType> = qkv.clone();
                    want.dedup();
                    let got: Vec<GgmlType> = ld.qkv.iter().map(|m| m.2).collect();
                    assert_eq!(got, want, "{what} {l} qkv runs");
                    mixed += (want.len() > 1) as usize;
                    let n: usize = ld.qkv.iter().map(|m| m.0).sum();
                    let b = &plan.buckets[0].layers[l];
                    assert_eq!(b.qkv.len(), ld.qkv.len(), "{what} {l}");
                    assert!(b.qkv.iter().all(|m| m.input == b.qkv_input()));
                    let lc = &cfg.layers[l];
                    let kv = match (lc.owns_kv(), lc.k_eq_v) {
                        (false, _) => 0,
                        (true, true) => lc.kv_dim(),
                        (true, false) => 2 * lc.kv_dim(),
                    };
                    assert_eq!(n, lc.q_dim() + kv, "{what} {l} qkv width");
                }
                // Nothing is converted: every matrix and the Q6_K tied
                // head are read in their own types.
                assert!(dims.converted.is_empty(), "{what}: {:?}", dims.converted);
                let mixes = matches!(w, WeightType::Q4KM | WeightType::Q5KM);
                assert_eq!(mixed > 0, mixes, "{what}: {mixed} mixed Q|K|V groups");
                if let Some(mp) = dims.ple_model_proj {
                    assert_eq!(mp.2, ty["per_layer_model_proj.weight"], "{what}");
                }
                // The bytes: exactly the sum of each matrix in the
                // layouts the plan reads, and for the uniform files
                // under strict (one layout, the GEMV's, and the head
                // on the table) the file's bytes, Q6_K's record
                // padding apart.
                let bytes = model_bytes(&dims, &plan.layouts);
                let ratio = bytes as f64 / dims.file_bytes as f64;
                eprintln!(
                    "{what}: weights {bytes} B on the device, {} B in the file ({ratio:.4}x), {} converted",
                    dims.file_bytes,
                    dims.converted.len()
                );
                if profile == "strict" && !mixes {
                    assert!(
                        plan.layouts.head_native,
                        "{what}: the head has its own copy"
                    );
                    let bound = if w == WeightType::Q6K {
                        216.0 / 210.0
                    } else {
                        1.0
                    };
                    assert!(ratio <= bound + 1e-9, "{what}: {ratio:.4}x the file");
                }
                assert!(ratio < 2.0, "{what}: {ratio:.4}x the file");
            }
        }
    }
}

/// `main` expands each quantized prefill GEMM's scale plane from the
/// GEMV's before it runs (`gemm_scales = "expand"`): prefill buckets
/// plan one `scale_expand` per such GEMM, decode buckets none, and the
/// weights but the head's own copy take the file's bytes (Q6_K: its
/// records' padding apart), so no quantized matrix uploads the GEMMs'
/// plane (16-bit ones have none).
/// `resident-scales` uploads both planes, so more bytes for every
/// quantized file and the same for BF16.
#[test]
fn expanded_gemm_scales_keep_the_weights_at_the_files_bytes() {
    use crate::synth::mix;
    for v in [SynthVariant::E4b, SynthVariant::B12] {
        let cfg = synth::preset(v);
        for w in [
            WeightType::Q8_0,
            WeightType::Q4_0,
            WeightType::Q4KM,
            WeightType::Q5KM,
            WeightType::Q6K,
            WeightType::Bf16,
        ] {
            let mut bytes = Vec::new();
            for profile in ["main", "resident-scales"] {
                let what = format!("{} {} {profile}", v.name(), w.name());
                let (plan, dims) = synth_plan(profile, &cfg, w, &what);
                let expand = profile == "main";
                let mut expanded = 0;
                for b in &plan.buckets {
                    let prefill = b.rows > GEMV_MAX_ROWS;
                    for l in &b.layers {
                        let mut ms: Vec<&MatmulPlan> = l.qkv.iter().collect();
                        ms.extend([&l.o, &l.gate_up, &l.down]);
                        for m in ms {
                            let quantized = WType::of(m.dim.2).is_some_and(|t| !t.is_16bit());
                            let f32_planes = m.bindings().iter().any(|b| b.layout == PLANES_F32);
                            assert_eq!(
                                m.scales.is_some(),
                                expand && prefill && quantized && f32_planes,
                                "{what} bucket {} {:?}",
                                b.rows,
                                m.proj
                            );
                            if let Some(id) = m.scales {
                                assert_eq!(plan.launches[id].slot, Slot::ScaleExpand);
                                assert_eq!(
                                    plan.launches[id].problem,
                                    Problem::matmul(1, m.dim.0, m.dim.1, m.dim.2)
                                );
                                expanded += 1;
                            }
                        }
                    }
                }
                let quantized = w != WeightType::Bf16;
                assert_eq!(expanded > 0, expand && quantized, "{what}: {expanded}");
                assert_eq!(
                    scale_scratch_bytes(&plan) > 0,
                    expand && quantized,
                    "{what}"
                );
                if expand {
                    // The head's own copy apart, unless it is the
                    // table's one copy (the gather reads its planes).
                    let mut no_head = plan.layouts;
                    no_head.head_native = !dims.embd_on_head;
                    let b = model_bytes(&dims, &no_head) as f64;
                    let ratio = b / dims.file_bytes as f64;
                    let types = mix::tensor_types(&crate::plan::tensor_plan(&cfg), cfg.n_layers, w);
                    let bound = if types.contains(&GgmlType::Q6K) {
                        216.0 / 210.0
                    } else {
                        1.0
                    };
                    eprintln!("{what}: weights but the head {ratio:.4}x the file");
                    assert!(ratio <= bound + 1e-9, "{what}: {ratio:.4}x the file");
                    assert!(ratio > 0.95, "{what}: {ratio:.4}x the file");
                }
                bytes.push(model_bytes(&dims, &plan.layouts));
            }
            if w == WeightType::Bf16 {
                assert_eq!(bytes[0], bytes[1], "{} bf16", v.name());
            } else {
                assert!(bytes[0] < bytes[1], "{} {}: {bytes:?}", v.name(), w.name());
            }
        }
    }
}

/// The OUT define the plan bound on launch `id` ("" when none).
fn out_of(plan: &ForwardPlan, id: LaunchId) -> String {
    plan.launches[id]
        .bound
        .iter()
        .find(|(k, _)| *k == "OUT")
        .map(|(_, v)| v.to_string())
        .unwrap_or_default()
}

/// `main` decodes the k-quant projections of a Q4_K_M file on split Q8
/// records that their inputs' producers write once per step: the
/// norms and gelu_mul with OUT=Q8_SPLIT, the quantize pre-pass with
/// OUT=Q8_SPLIT where attention writes f32. `kq-split` reads the f32
/// rows (each GEMV block splits them itself), with no pre-pass.
#[test]
fn kquant_decode_reads_split_records_written_once() {
    let cfg = synth::preset(SynthVariant::E4b);
    for (profile, want) in [("main", ActFormat::Q8Split), ("kq-split", ActFormat::F32)] {
        let what = format!("e4b q4_k_m {profile}");
        let (plan, _) = synth_plan(profile, &cfg, WeightType::Q4KM, &what);
        let mut prepasses = 0;
        for b in plan.buckets.iter().filter(|b| b.rows <= GEMV_MAX_ROWS) {
            for (l, lp) in b.layers.iter().enumerate() {
                let mut ms: Vec<&MatmulPlan> = lp.qkv.iter().collect();
                ms.extend([&lp.o, &lp.gate_up, &lp.down]);
                for m in ms {
                    if WType::of(m.dim.2).is_some_and(|t| t.is_kquant()) {
                        assert_eq!(
                            m.input, want,
                            "{what} bucket {} layer {l} {:?}",
                            b.rows, m.proj
                        );
                    }
                }
                assert_eq!(
                    out_of(&plan, lp.input_norm),
                    lp.qkv[0].input.define(),
                    "{what} layer {l}"
                );
                if let Some(g) = lp.gelu {
                    assert_eq!(out_of(&plan, g), lp.down.input.define(), "{what} layer {l}");
                }
                match lp.o.prepass {
                    Some(pp) => {
                        assert_eq!(plan.launches[pp.launch].slot, Slot::QuantizeQ8_1);
                        assert_eq!(out_of(&plan, pp.launch), lp.o.input.define());
                        prepasses += 1;
                    }
                    None => assert!(
                        lp.o.input == ActFormat::F32 || lp.attention.out == lp.o.input,
                        "{what} layer {l}: O reads {:?} with no pre-pass",
                        lp.o.input
                    ),
                }
            }
        }
        assert_eq!(prepasses > 0, profile == "main", "{what}: {prepasses}");
    }
}

/// `main` decodes a Q8_0 file's QKV, gate|up and down on split Q8
/// records that the input norm, the attention residual norm and gelu_mul
/// (`q8-fused`: the fused gate|up GEMV) write, with no quantize pre-pass
/// anywhere; O, the
/// PLE GEMVs and the head read f32 rows on FMA. `q8-fma` and `strict`
/// read f32 rows everywhere (ALGO 0), `dp4a` Q8_1 everywhere but the head:
/// the profiles that restate main's typed Q8_0 entries get what they say.
#[test]
fn q8_0_decode_reads_split_records_where_the_producer_writes_them() {
    let cfg = synth::preset(SynthVariant::E4b);
    // (profile, ALGO of QKV / gate|up / down, ALGO of O and the PLE GEMVs)
    for (profile, fed, fma) in [
        ("main", 3, 0),
        ("q8-fused", 3, 0),
        ("q8-fma", 0, 0),
        ("strict", 0, 0),
        ("dp4a", 1, 1),
    ] {
        let what = format!("e4b q8_0 {profile}");
        let (plan, _) = synth_plan(profile, &cfg, WeightType::Q8_0, &what);
        let algo = |m: &MatmulPlan| -> i64 {
            let MatmulExec::Kernel { launch, .. } = &m.exec else {
                panic!("{what} {:?}: not one kernel launch", m.proj);
            };
            match plan.launches[*launch].res.defines.get("ALGO") {
                Some(DefineValue::Int(a)) => *a,
                other => panic!("{what} {:?}: ALGO {other:?}", m.proj),
            }
        };
        let format = |a: i64| match a {
            0 => ActFormat::F32,
            1 => ActFormat::Q8_1,
            _ => ActFormat::Q8Split,
        };
        let out_define = |id: LaunchId| out_of(&plan, id);
        let mut seen = 0;
        for b in plan.buckets.iter().filter(|b| b.rows <= GEMV_MAX_ROWS) {
            for (l, lp) in b.layers.iter().enumerate() {
                let mut fed_by_producer: Vec<&MatmulPlan> = lp.qkv.iter().collect();
                fed_by_producer.extend([&lp.gate_up, &lp.down]);
                for m in fed_by_producer {
                    let at = format!("{what} bucket {} layer {l} {:?}", b.rows, m.proj);
                    assert_eq!(algo(m), fed, "{at}");
                    assert_eq!(m.input, format(fed), "{at}");
                    assert!(m.prepass.is_none(), "{at}: the producer writes the input");
                    seen += 1;
                }
                let mut f32_fed: Vec<&MatmulPlan> = vec![&lp.o];
                if let Some(p) = &lp.ple {
                    f32_fed.extend([&p.gate, &p.proj]);
                }
                for m in f32_fed {
                    let at = format!("{what} bucket {} layer {l} {:?}", b.rows, m.proj);
                    assert_eq!(algo(m), fma, "{at}");
                    assert_eq!(m.input, format(fma), "{at}");
                }
                assert!(lp.o.prepass.is_some() == (fma != 0), "{what} layer {l}");
                // q8-fused fuses gate|up and writes down's records from it.
                let fused = profile == "q8-fused";
                assert_eq!(lp.gate_up.fuses_gelu(), fused, "{what} layer {l}");
                assert_eq!(lp.gelu.is_none(), fused, "{what} layer {l}");
                if fused {
                    assert_eq!(lp.gate_up.output(), ActFormat::Q8Split, "{what} layer {l}");
                }
                assert_eq!(
                    out_define(lp.input_norm),
                    lp.qkv[0].input.define(),
                    "{what} layer {l}"
                );
                if let Some(g) = lp.gelu {
                    assert_eq!(out_define(g), lp.down.input.define(), "{what} layer {l}");
                }
            }
            if let Some(h) = &b.head {
                let want = if profile == "dp4a" { 1 } else { 0 };
                assert_eq!(algo(&h.matmul), want, "{what} head");
            }
        }
        assert!(seen > 0, "{what}: no decode bucket");
    }
}

/// A fused gate+up GEMV (FUSE=1) whose down projection reads split Q8
/// records is bound to write them (OUT=Q8_SPLIT): no gelu_mul and no
/// pre-pass between the two GEMVs at decode; prefill keeps its GEMMs and
/// gelu_mul. A fused GEMV that cannot write records (16 rows a block)
/// writes f32 and down gets its pre-pass, as before.
#[test]
fn a_fused_gate_up_writes_the_down_projections_records() {
    let cfg = synth::preset(SynthVariant::E4b);
    let fused = |rows: i64, warps: i64| {
        format!(
            "name = \"fused\"\nbase = \"main\"\n\n[slot.\"gemv.gate_up@Q8_0\"]\nfamily = \"gemv\"\ndefines = {{ ALGO = 3, LAYOUT = 1, ROWS = {rows}, WARPS = {warps}, FUSE = 1, KSPLIT = 1, UNROLL = 1 }}\n"
        )
    };
    for (rows, warps, records) in [(4, 8, true), (2, 8, false)] {
        let what = format!("e4b q8_0 fused ROWS={rows} WARPS={warps}");
        let profile = Profile::parse("fused.toml", &fused(rows, warps)).expect("profile");
        let (plan, _) = synth_plan_of(profile, &cfg, WeightType::Q8_0, &what);
        let mut decode = 0;
        for b in &plan.buckets {
            for (l, lp) in b.layers.iter().enumerate() {
                let at = format!("{what} bucket {} layer {l}", b.rows);
                if b.rows > GEMV_MAX_ROWS {
                    assert!(!lp.gate_up.fuses_gelu(), "{at}");
                    assert!(lp.gelu.is_some(), "{at}");
                    continue;
                }
                decode += 1;
                assert!(lp.gate_up.fuses_gelu(), "{at}");
                assert!(lp.gelu.is_none(), "{at}: no gelu_mul launch");
                assert_eq!(lp.down.input, ActFormat::Q8Split, "{at}");
                // One block per 32 (or 16) outputs of gelu(gate) * up,
                // not of the whole gate|up matrix.
                let MatmulExec::Kernel { launch, .. } = &lp.gate_up.exec else {
                    panic!("{at}: one launch");
                };
                let ff = lp.gate_up.dim.0 / 2;
                let per_block = (warps * rows) as usize;
                assert_eq!(
                    plan.launches[*launch].res.geo.grid.0 as usize,
                    ff.div_ceil(per_block),
                    "{at}"
                );
                if records {
                    assert_eq!(lp.gate_up.output(), ActFormat::Q8Split, "{at}");
                    assert!(lp.down.prepass.is_none(), "{at}");
                } else {
                    assert_eq!(lp.gate_up.output(), ActFormat::F32, "{at}");
                    assert!(lp.down.prepass.is_some(), "{at}: f32 out, quantized in");
                }
            }
        }
        assert!(decode > 0, "{what}");
    }
}

/// The tied head's own copy is uploaded in the type its launches were
/// planned for (`weights::head_copy_type`), whatever the profile
/// decides: main keeps a Q6_K head in its plane repack and the gather
/// reads those planes (no table copy), q8-head converts it to Q8_0
/// (`head_convert`), strict and q6k-head read the table.
#[test]
fn the_head_copy_is_uploaded_in_the_planned_type() {
    let mut cfg = synth::preset(SynthVariant::Tiny);
    cfg.d_model = 256;
    for w in [WeightType::Q4_0, WeightType::Q4KM, WeightType::Q8_0] {
        for profile in ["main", "strict", "q6k-head", "q8-head", "cublas", "dp4a"] {
            let planner = Planner::new(
                Profile::load(profile).expect("profile"),
                None,
                DeviceLimits::for_arch(Arch(90)),
            );
            let dims = ModelDims::of_synth(&cfg, w, &planner);
            let kv_type = if profile == "strict" {
                KvType::F32
            } else {
                KvType::F16
            };
            let sizing = Sizing {
                max_seq: 256,
                ubatch: 64,
                kv_type,
            };
            let plan = ForwardPlan::resolve(&planner, &cfg, &dims, sizing)
                .unwrap_or_else(|e| panic!("{profile} {}: {e}", w.name()));
            let file = w.embedding_type(cfg.d_model as u64);
            let what = format!("{profile} {} (table {})", w.name(), file.name());
            if plan.layouts.head_native {
                assert_eq!(dims.head.2, file, "{what}");
                continue;
            }
            let copy = weights::head_copy_type(&plan.layouts, file);
            assert_eq!(copy.ggml(), dims.head.2, "{what}");
            // main reads the Q6_K head from its plane repack, which the
            // gather shares; q8-head converts it beside the table.
            let q6k = file == GgmlType::Q6K;
            if profile == "main" && q6k {
                assert_eq!(copy, WType::Q6K, "{what}: main keeps Q6_K");
            }
            if profile == "q8-head" && q6k {
                assert_eq!(copy, WType::Q8_0, "{what}: q8-head asks for Q8_0");
            }
            let own_head = ["strict", "q6k-head", "q8-head"].contains(&profile);
            assert_eq!(
                dims.embd_on_head,
                q6k && !own_head,
                "{what}: the gather reads the head's planes"
            );
        }
    }
}

/// `strict` refuses what it would convert lossily (F32 projections:
/// no matmul kernel reads them; the mixes' mixed Q|K|V groups), naming
/// the matrices and why; `main` loads them and lists the conversions;
/// the uniform native files pass both.
#[test]
fn lossless_profiles_refuse_lossy_conversions() {
    use crate::cuda::engine::refuse_lossy;
    let cfg = synth::preset(SynthVariant::Tiny);
    for (w, refused) in [
        (WeightType::F32, "no matmul kernel reads f32"),
        (WeightType::Q8_0, ""),
        (WeightType::F16, ""),
        (WeightType::Bf16, ""),
    ] {
        for profile in ["main", "strict"] {
            let p = Profile::load(profile).expect("profile");
            let planner = Planner::new(p.clone(), None, DeviceLimits::for_arch(Arch(90)));
            let dims = ModelDims::of_synth(&cfg, w, &planner);
            let r = refuse_lossy(&p, &dims);
            match (refused, profile) {
                ("", _) | (_, "main") => {
                    assert!(r.is_ok(), "{} {profile}: {r:?}", w.name());
                    assert_eq!(
                        dims.converted.is_empty(),
                        refused.is_empty(),
                        "{}",
                        w.name()
                    );
                }
                (why, _) => {
                    let e = r.expect_err("refused").to_string();
                    assert!(e.contains(why) && e.contains("attn_qkv"), "{e}");
                }
            }
        }
    }
}

/// The integer define `k` of launch `id`.
fn int_define(plan: &ForwardPlan, id: LaunchId, k: &str) -> i64 {
    match plan.launches[id].res.defines.get(k) {
        Some(DefineValue::Int(v)) => *v,
        other => panic!("{k}: {other:?}"),
    }
}

/// Every expert GEMV group of the plan's MoE layers, with its bucket's rows.
fn expert_groups(plan: &ForwardPlan) -> Vec<(usize, &MoeGroupPlan)> {
    let mut out = Vec::new();
    for b in &plan.buckets {
        for lp in &b.layers {
            if let Some(MoeExperts::Groups(gs)) = lp.moe.as_ref().map(|m| &m.experts) {
                out.extend(gs.iter().map(|g| (b.rows, g)));
            }
        }
    }
    out
}

/// The expert down stage reads h as split records (moe_gemv ALGO 3) only
/// where the plan binds its gate|up to write them (H_RECORDS=1): main on
/// every dp4a-able stack, neither under `moe-split` (both stages split
/// per block) nor `strict` (FMA); a profile whose gate|up cannot write
/// whole records under a records-reading down is refused with the reason.
#[test]
fn moe_down_reads_the_records_its_gate_up_writes() {
    let cases = [
        ("main", SynthVariant::B26A4b, WeightType::Q8_0, true),
        ("main", SynthVariant::B26A4b, WeightType::Q4KM, true),
        ("main", SynthVariant::TinyMoe, WeightType::Q4_0, true),
        ("main", SynthVariant::TinyMoe, WeightType::F16, false),
        (
            "../variants/profiles/moe-split.toml",
            SynthVariant::B26A4b,
            WeightType::Q8_0,
            false,
        ),
        ("strict", SynthVariant::TinyMoe, WeightType::Q8_0, false),
    ];
    for (profile, v, w, records) in cases {
        let cfg = synth::preset(v);
        let what = format!("{profile} {v:?} {w:?}");
        let (plan, _) = synth_plan(profile, &cfg, w, &what);
        let groups = expert_groups(&plan);
        assert!(!groups.is_empty(), "{what}: no expert GEMV groups");
        for (bucket, g) in groups {
            let at = format!("{what} bucket {bucket} group {}", g.rows);
            let algo = int_define(&plan, g.down, "ALGO");
            assert_eq!(algo == 3, records, "{at}: down ALGO {algo}");
            assert_eq!(
                int_define(&plan, g.gate_up, "H_RECORDS") == 1,
                records,
                "{at}"
            );
        }
    }
    let narrow = Profile::parse(
        "narrow.toml",
        "name = \"narrow\"\nbase = \"main\"\n\n[slot.\"moe_gemv@Q8_0\"]\nfamily = \"moe_gemv\"\ndefines = { ALGO = 2, LAYOUT = 1, ROWS = 2, WARPS = 8, UNROLL = 1, KSPLIT = 1, COUNT_BYTES = 0 }\n",
    )
    .expect("profile");
    let cfg = synth::preset(SynthVariant::B26A4b);
    let e = resolve_synth(narrow, &cfg, WeightType::Q8_0)
        .err()
        .expect("a gate|up of 16-row blocks cannot write whole records");
    assert!(e.to_string().contains("gate_up must write them"), "{e}");
}

/// `moe-preload` binds PRELOAD=1 on the expert down GEMV of every stack
/// and on the Q8_0 gate|up (each reads before its wait only what grids
/// before its predecessor wrote: moe_gemv.cu, Prologue), keeps the Q4_K
/// gate|up at main's HOIST form and chains the step; main binds PRELOAD
/// on neither and keeps a mixture-of-experts step in stream order.
#[test]
fn moe_preload_binds_where_its_profile_says() {
    let pre = "../variants/profiles/moe-preload.toml";
    let cases = [
        ("main", SynthVariant::B26A4b, WeightType::Q8_0, 0, 0),
        ("main", SynthVariant::B26A4b, WeightType::Q4KM, 0, 0),
        (pre, SynthVariant::B26A4b, WeightType::Q8_0, 1, 1),
        (pre, SynthVariant::B26A4b, WeightType::Q4KM, 0, 1),
        // The model of cuda_moe's bit-identity test of the profile.
        (pre, SynthVariant::TinyMoe, WeightType::Q8_0, 1, 1),
    ];
    for (profile, v, w, gate_up, down) in cases {
        let cfg = synth::preset(v);
        let what = format!("{profile} {v:?} {w:?}");
        let (plan, _) = synth_plan(profile, &cfg, w, &what);
        let groups = expert_groups(&plan);
        assert!(!groups.is_empty(), "{what}: no expert GEMV groups");
        for (bucket, g) in groups {
            let at = format!("{what} bucket {bucket} group {}", g.rows);
            assert_eq!(int_define(&plan, g.gate_up, "PRELOAD"), gate_up, "{at}");
            assert_eq!(int_define(&plan, g.down, "PRELOAD"), down, "{at}");
            if gate_up == 0 && w == WeightType::Q4KM {
                assert_eq!(int_define(&plan, g.gate_up, "HOIST"), 1, "{at}");
            }
        }
        let chained = Profile::load(profile).expect("profile").decode_launch;
        assert_eq!(chained == DecodeLaunch::Chained, profile == pre, "{what}");
    }
}

/// `moe-early` launches each MoE layer's router before the shared MLP and
/// binds PRELOAD=2 on the Q8_0 and Q4_K gate|up (its whole HOIST prologue
/// before the wait), PRELOAD=1 on down; main keeps the router late. A
/// profile that binds PRELOAD=2 with the router late is refused: the ids
/// would be its predecessor's output.
#[test]
fn moe_early_routes_before_the_shared_mlp_and_refuses_preload2_without_it() {
    let early = "../variants/profiles/moe-early.toml";
    let cases = [
        ("main", WeightType::Q8_0, false, 0, 0),
        (early, WeightType::Q8_0, true, 2, 1),
        (early, WeightType::Q4KM, true, 2, 1),
    ];
    for (profile, w, route_early, gate_up, down) in cases {
        for v in [SynthVariant::B26A4b, SynthVariant::TinyMoe] {
            let cfg = synth::preset(v);
            let what = format!("{profile} {v:?} {w:?}");
            let (plan, _) = synth_plan(profile, &cfg, w, &what);
            let mut layers = 0;
            for lp in plan.buckets.iter().flat_map(|b| &b.layers) {
                if let Some(m) = &lp.moe {
                    assert_eq!(m.route_early, route_early, "{what}");
                    layers += 1;
                }
            }
            assert!(layers > 0, "{what}: no MoE layer");
            for (bucket, g) in expert_groups(&plan) {
                let at = format!("{what} bucket {bucket} group {}", g.rows);
                assert_eq!(int_define(&plan, g.gate_up, "PRELOAD"), gate_up, "{at}");
                assert_eq!(int_define(&plan, g.down, "PRELOAD"), down, "{at}");
                if gate_up == 2 {
                    assert_eq!(int_define(&plan, g.gate_up, "HOIST"), 1, "{at}");
                }
            }
        }
    }
    // moe-early's gate|up entry with the router late.
    let text = r#"
name = "late-preload2"
base = "main"
[slot."moe_gemv@Q8_0"]
family = "moe_gemv"
defines = { ALGO = 2, LAYOUT = 1, ROWS = 4, WARPS = 8, UNROLL = 1, KSPLIT = 1, COUNT_BYTES = 0, HOIST = 1, PRELOAD = 2 }
"#;
    let profile = Profile::parse("late-preload2.toml", text).expect("parses");
    let cfg = synth::preset(SynthVariant::TinyMoe);
    let e = resolve_synth(profile, &cfg, WeightType::Q8_0)
        .err()
        .expect("PRELOAD=2 with the router after the shared MLP");
    assert!(e.to_string().contains("moe_route = \"early\""), "{e}");
}

/// `ple_gelu = "fused"` (main): every decode bucket's PLE gate whose
/// projection reads f32 rows (Q8_0: FMA) is a GEMV bound to FUSE=2
/// (gelu(gate) times the per-layer input, its side operand) and no
/// gelu_mul launch follows it; where the projection reads Q8_1 (Q4_0's
/// dp4a) gelu_mul writes that, and prefill buckets and `ple-separate` keep
/// the gate plain and the gelu_mul launch. The profile key is inherited
/// (`strict` fuses too: the same f32 arithmetic), read and checked.
#[test]
fn the_ple_gate_multiplies_its_own_gelu_in_decode() {
    let fuse_of = |plan: &ForwardPlan, m: &MatmulPlan| -> i64 {
        let MatmulExec::Kernel { launch, .. } = &m.exec else {
            return -1;
        };
        match plan.launches[*launch].res.defines.get("FUSE") {
            Some(DefineValue::Int(f)) => *f,
            _ => -1,
        }
    };
    for v in [SynthVariant::E2b, SynthVariant::E4b] {
        for (profile, w, fused) in [
            ("main", WeightType::Q8_0, true),
            ("main", WeightType::Q4_0, false),
            (
                "../variants/profiles/ple-separate.toml",
                WeightType::Q8_0,
                false,
            ),
            // strict inherits the key: the same f32 arithmetic either way.
            ("strict", WeightType::Q8_0, true),
        ] {
            let cfg = synth::preset(v);
            let what = format!("{v:?} {w:?} {profile}");
            let (plan, _) = synth_plan(profile, &cfg, w, &what);
            let (mut decode, mut prefill) = (0, 0);
            for b in &plan.buckets {
                for (l, lp) in b.layers.iter().enumerate() {
                    let Some(p) = &lp.ple else { continue };
                    let at = format!("{what} bucket {} layer {l}", b.rows);
                    let side = p.gate.bindings().iter().any(|b| b.side);
                    if b.rows > GEMV_MAX_ROWS || !fused {
                        prefill += usize::from(b.rows > GEMV_MAX_ROWS);
                        if w == WeightType::Q4_0 && b.rows <= GEMV_MAX_ROWS {
                            assert_eq!(p.proj.input, ActFormat::Q8_1, "{at}");
                        }
                        assert!(!side, "{at}");
                        assert!(p.gelu.is_some(), "{at}: gelu_mul launch");
                        continue;
                    }
                    decode += 1;
                    assert!(side, "{at}");
                    assert_eq!(fuse_of(&plan, &p.gate), 2, "{at}");
                    assert!(p.gelu.is_none(), "{at}: no gelu_mul launch");
                    assert_eq!(p.gate.output(), ActFormat::F32, "{at}");
                    assert_eq!(p.proj.input, ActFormat::F32, "{at}");
                }
            }
            assert!(decode > 0 || !fused, "{what}: no fused decode layer");
            assert!(prefill > 0, "{what}: no prefill layer");
        }
    }
    assert!(Profile::load("main").expect("main").fuse_ple_gelu);
    assert!(
        !Profile::load("../variants/profiles/ple-separate.toml")
            .expect("ple-separate")
            .fuse_ple_gelu
    );
    let bad = Profile::parse(
        "bad.toml",
        "name = \"bad\"\nbase = \"main\"\nple_gelu = \"sometimes\"\n",
    )
    .expect_err("an unknown ple_gelu");
    assert!(
        bad.to_string().contains("write \"fused\" or \"separate\""),
        "{bad}"
    );
}

/// `norm_tail = "fused"` (`main`): in a dense model's decode buckets the
/// output projection runs the attention residual and the FFN input norm in
/// its tail (TAIL_OUT = gate|up's input format), down the FFN residual
/// before the PLE (TAIL_OUT=NONE) or the layer's end, the PLE projection
/// the layer's end, the end writing the next layer's input norm in its QKV
/// format (the last layer: the residual only), wherever the projection's
/// variant runs blocks of at least `TAIL_MIN_WARPS` warps; the norm it
/// runs is then no launch. Elsewhere, in prefill buckets, in a MoE layer
/// and under `norm-tail-separate` every norm is a launch. Which
/// projections carry a tail follows the profile's slots: all three on
/// `norm-tail`'s E2B/E4B Q8_0, output and down on main's Q4_0, none on
/// main's Q8_0 (2- and 4-warp blocks) and k-quant slots.
#[test]
fn decode_projections_run_the_norm_after_them_in_their_tail() {
    let defines = |plan: &ForwardPlan, m: &MatmulPlan| -> Option<Defines> {
        match &m.exec {
            MatmulExec::Kernel { launch, .. } => Some(plan.launches[*launch].res.defines.clone()),
            _ => None,
        }
    };
    let int = |d: &Defines, k: &str| match d.get(k) {
        Some(DefineValue::Int(v)) => *v,
        other => panic!("{k} = {other:?}"),
    };
    let separate = "../variants/profiles/norm-tail-separate.toml";
    // (o, down, PLE projection) tailed in the decode buckets.
    let all = (true, true, true);
    let none = (false, false, false);
    for (v, w, profile, want) in [
        (SynthVariant::E4b, WeightType::Q8_0, "norm-tail", all),
        (SynthVariant::E2b, WeightType::Q8_0, "norm-tail", all),
        (
            SynthVariant::B31,
            WeightType::Q4_0,
            "main",
            (true, true, false),
        ),
        (
            SynthVariant::B12,
            WeightType::Q4_0,
            "main",
            (true, true, false),
        ),
        (
            SynthVariant::E4b,
            WeightType::Q4_0,
            "main",
            (true, true, false),
        ),
        (SynthVariant::E4b, WeightType::Q8_0, "main", none),
        (SynthVariant::E4b, WeightType::Q4KM, "main", none),
        (SynthVariant::E4b, WeightType::Q8_0, separate, none),
        (SynthVariant::B31, WeightType::Q4_0, separate, none),
    ] {
        let cfg = synth::preset(v);
        let what = format!("{v:?} {w:?} {profile}");
        let (plan, _) = synth_plan(profile, &cfg, w, &what);
        let mut tailed = 0;
        for b in &plan.buckets {
            let n = b.layers.len();
            for (l, lp) in b.layers.iter().enumerate() {
                let at = format!("{what} bucket {} layer {l}", b.rows);
                let last = lp.ple.as_ref().map_or(&lp.down, |pp| &pp.proj);
                let decode = b.rows <= GEMV_MAX_ROWS;
                let o = decode && want.0;
                let (down, ple) = if lp.ple.is_some() {
                    (decode && want.1, decode && want.2)
                } else {
                    (decode && want.1, decode && want.1)
                };
                // Each bound tail sits on a block of 8 warps or more.
                for m in [&lp.o, &lp.down, last] {
                    if m.tail() != TailMode::None {
                        let d = defines(&plan, m).expect("a tail is one launch");
                        assert_eq!(int(&d, "TAIL"), 1, "{at}");
                        assert!(int(&d, "WARPS") >= TAIL_MIN_WARPS, "{at}");
                    }
                }
                tailed += usize::from(o);
                if o {
                    assert_eq!(lp.o.tail(), TailMode::Norm(lp.gate_up.input), "{at}");
                    let out = lp.gate_up.input.define().to_string();
                    let d = defines(&plan, &lp.o).expect("o");
                    assert_eq!(d.get("TAIL_OUT"), Some(&DefineValue::Str(out)), "{at}");
                    assert!(lp.attn_residual.is_none(), "{at}");
                } else {
                    assert_eq!(lp.o.tail(), TailMode::None, "{at}");
                    assert!(lp.attn_residual.is_some(), "{at}");
                }
                if let Some(pp) = &lp.ple {
                    assert_eq!(
                        lp.down.tail(),
                        if down {
                            TailMode::Residual
                        } else {
                            TailMode::None
                        },
                        "{at}"
                    );
                    assert_eq!(pp.ffn_residual.is_none(), down, "{at}");
                }
                let end_in_tail = if lp.ple.is_some() { ple } else { down };
                if end_in_tail {
                    let end = match b.layers.get(l + 1) {
                        Some(next) => TailMode::Norm(next.qkv_input()),
                        None => TailMode::Residual,
                    };
                    assert_eq!(last.tail(), end, "{at}");
                    assert!(lp.end.is_none() && lp.end_with_next_norm.is_none(), "{at}");
                } else {
                    assert_eq!(last.tail(), TailMode::None, "{at}");
                    assert!(lp.end.is_some(), "{at}");
                    assert_eq!(lp.end_with_next_norm.is_some(), l + 1 < n, "{at}");
                }
            }
        }
        assert_eq!(tailed > 0, want.0, "{what}: {tailed} tailed decode layers");
    }
    assert!(Profile::load("main").expect("main").fuse_norm_tail);
    assert!(
        Profile::load("norm-tail")
            .expect("norm-tail")
            .fuse_norm_tail
    );
    assert!(
        !Profile::load(separate)
            .expect("norm-tail-separate")
            .fuse_norm_tail
    );
    let bad = Profile::parse(
        "bad.toml",
        "name = \"bad\"\nbase = \"main\"\nnorm_tail = \"late\"\n",
    )
    .expect_err("an unknown norm_tail");
    assert!(bad.to_string().contains("norm_tail = \"late\""), "{bad}");
}
