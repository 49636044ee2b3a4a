//! The CUDA engine on the mixture-of-experts model (26B-A4B's block at
//! tiny size, `tiny-moe`: 6 experts of 96, top-2, a shared MLP, per-expert
//! scales, the router on the residual stream), against the CPU engine.
//!
//! Every test needs a CUDA GPU (and NVRTC) and is ignored by default; run
//! with `--include-ignored` on a GPU host. Without a GPU they fail.
//!
//! - `strict`: RMS-relative logit error under 1e-5 against the CPU engine
//!   on every weight type the expert kernels read in their own bits, and a
//!   Q4_K_M mix whose Q5_0 fallbacks are widened exactly to Q8_0, over
//!   a prefill whose chunks cut into groups of 8 rows with a remainder,
//!   then decode steps.
//! - `main`: top-1 agreement of 99 % or more, and the rows within an
//!   RMS-relative error of 1e-2: 99 % of them on Q8_0, the median row on
//!   the other types (a row routed to another expert by main's rounding
//!   can be far off; see `assert_main_bar`).
//! - `main`'s prefill on the grouped expert GEMMs (`moe_gemm`, a tiny-moe
//!   with widths its tiles cut) within the same bar.
//! - Graph decode bit-identical to eager decode, and the decode step's
//!   launches chained (`decode_launch` chained, chained-dense) bit-identical
//!   to plain ones; `moe-preload` (the expert GEMVs reading the router's
//!   ids and x before the chained launch's wait) too.

#[path = "common/engines.rs"]
mod engines;

use engines::{compare_engines, cuda, decode_bits_with, decode_bits_with_launch, prompt};
use gemtune_engine::engine::Engine;
use gemtune_engine::forward::LogitRows;
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
use gemtune_engine::synth::{self, SynthModel, SynthOptions, SynthVariant, WeightType};

fn tiny_moe(w: WeightType) -> Model {
    let bytes = synth::synth_to_vec(
        SynthVariant::TinyMoe,
        w,
        SynthOptions {
            vocab: Some(4096),
            seed: 21,
        },
    )
    .expect("synth tiny-moe");
    let name = format!("tiny-moe-{}", w.name());
    Model::from_gguf(GgufFile::from_bytes(bytes, &name).expect("gguf")).expect("load")
}

/// tiny-moe with d_model 256 and experts of 128: widths `moe_gemm`'s tiles
/// cut (whole 64-element k steps), so `main`'s prefill runs the grouped
/// expert GEMMs (tiny-moe's 96 runs the expert GEMV groups).
fn tiny_moe_wide(w: WeightType) -> Model {
    let mut cfg = synth::preset(SynthVariant::TinyMoe);
    cfg.d_model = 256;
    cfg.vocab_size = 4096;
    if let Some(m) = cfg.moe.as_mut() {
        m.expert_ffn_dim = 128;
    }
    let bytes = SynthModel::from_config(cfg, w, 23)
        .and_then(|s| s.write_to_vec())
        .expect("synth tiny-moe-wide");
    let name = format!("tiny-moe-wide-{}", w.name());
    Model::from_gguf(GgufFile::from_bytes(bytes, &name).expect("gguf")).expect("load")
}

/// Types whose expert stacks `moe_gemv` reads in their own bits.
const TYPES: [WeightType; 4] = [
    WeightType::Q8_0,
    WeightType::Q4_0,
    WeightType::F16,
    WeightType::Bf16,
];

#[test]
#[ignore = "needs a CUDA GPU"]
fn strict_matches_the_cpu_engine_on_tiny_moe() {
    // Q4_K_M too: tiny-moe's widths make its mix Q5_0 / Q8_0 fallbacks
    // (read as Q8_0 widened exactly) beside native Q4_K and Q6_K tensors.
    for w in TYPES.into_iter().chain([WeightType::Q4KM]) {
        let m = tiny_moe(w);
        // 197 prompt rows in chunks of 64: groups of 8 and a remainder of
        // 5 rows (197 = 3 * 64 + 5), then decode steps to 256.
        let a = compare_engines(&m, "strict", 197, 64);
        eprintln!(
            "tiny-moe {} strict: worst rms_rel {:.3e}, top-1 {:.4}",
            w.name(),
            a.worst_rms,
            a.top1
        );
        assert!(
            a.worst_rms < 1e-5,
            "tiny-moe {} strict: worst row rms_rel {:.3e}",
            w.name(),
            a.worst_rms
        );
    }
}

/// main's bar on a MoE model, printed for every weight type before any is
/// asserted: 99 % top-1 on every type, and the rows' rms_rel within main's
/// 1e-2, for 99 % of the rows on Q8_0 (the synthetic files' default type)
/// and for the median row on the others. Routing is a discontinuity the
/// dense models do not have: a row whose router logits hold two experts
/// closer than main's rounding (f16 GEMM operands, the f16 KV cache; on
/// Q4_0 also dp4a over Q8_1 activations) can route to another expert than
/// the CPU engine's, which on a random tiny router moves that row's logits
/// by far more than 1e-2. On an H100 (call D of
/// reports/h100-2026-11-27-moe) every type kept top-1 at 100 %, with p99 /
/// worst rows of 7.5e-4 / 7.8e-4 (Q8_0), 6.2e-4 / 6.4e-4 (BF16), 1.7e-2 /
/// 6.2e-2 (F16) and 3.3e-2 / 2.1e-1 (Q4_0). The expert kernels themselves
/// are held to 1e-5 by `strict` on the same files.
fn assert_main_bar(results: &[(WeightType, engines::Agreement)], what: &str) {
    let mut bad = Vec::new();
    for (w, a) in results {
        let (p50, p99) = (a.quantile(0.5), a.quantile(0.99));
        eprintln!(
            "{what} {} main: rms_rel p50 {p50:.3e}, p99 {p99:.3e}, worst {:.3e}, top-1 {:.4}",
            w.name(),
            a.worst_rms,
            a.top1
        );
        let held = if *w == WeightType::Q8_0 { p99 } else { p50 };
        if held >= 1e-2 || a.top1 < 0.99 {
            bad.push(format!(
                "{} (p50 {p50:.3e}, p99 {p99:.3e}, top-1 {:.4})",
                w.name(),
                a.top1
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{what} main over its bar: {}",
        bad.join(", ")
    );
}

/// tiny-moe's d_model of 128 is not whole k-quant super-blocks, so its
/// Q4_K_M mix holds mostly Q5_0 / Q8_0 fallbacks (the CUDA engine reads the
/// Q5_0 ones as Q8_0 widened exactly): its k-quants run on `tiny_moe_wide`
/// below.
#[test]
#[ignore = "needs a CUDA GPU"]
fn main_agrees_with_the_cpu_engine_on_tiny_moe() {
    let results: Vec<_> = TYPES
        .into_iter()
        .map(|w| (w, compare_engines(&tiny_moe(w), "main", 197, 64)))
        .collect();
    assert_main_bar(&results, "tiny-moe");
}

/// `main`'s prefill on the grouped expert GEMMs (`moe_gemm`: pairs sorted
/// by expert, f16-operand tensor-core tiles, the weighted sum per row),
/// decode on the expert GEMVs: the bar of the test above, and the plan
/// really runs the grouped GEMMs.
#[test]
#[ignore = "needs a CUDA GPU"]
fn main_grouped_expert_gemms_agree_on_tiny_moe_wide() {
    let mut results = Vec::new();
    for w in [
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Bf16,
        WeightType::Q4KM,
    ] {
        let m = tiny_moe_wide(w);
        let e = cuda(&m, "main", 256, 64, true);
        assert!(
            e.plan().moe_gemm_bm().is_some(),
            "tiny-moe-wide {}: the prefill buckets do not run moe_gemm",
            w.name()
        );
        drop(e);
        results.push((w, compare_engines(&m, "main", 197, 64)));
    }
    assert_main_bar(&results, "tiny-moe-wide");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn graph_decode_is_bit_identical_to_eager_decode_on_tiny_moe() {
    let m = tiny_moe(WeightType::Q8_0);
    let toks = prompt(&m, 80, 4);
    let run = |graph: bool| -> (Vec<Vec<u32>>, u64) {
        let mut e = cuda(&m, "main", 128, 32, graph);
        e.forward(&toks[..29], LogitRows::None).expect("prefill");
        let mut rows = Vec::new();
        for &t in &toks[29..80] {
            let l = e.forward(&[t], LogitRows::Last).expect("decode");
            rows.push(l.row(0).iter().map(|v| v.to_bits()).collect());
        }
        (rows, e.graph_replays())
    };
    let (g, replays) = run(true);
    let (eager, _) = run(false);
    assert_eq!(
        replays, 51,
        "the captured graph must serve every decode step"
    );
    assert!(g == eager, "graph decode differs from eager decode");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn chained_decode_is_bit_identical_to_plain_decode_on_tiny_moe() {
    let m = tiny_moe(WeightType::Q8_0);
    let toks = prompt(&m, 70, 6);
    let run = |launch: &str| decode_bits_with_launch(&m, launch, &toks, 29);
    let (plain, n_plain) = run("plain");
    let (chained, n_chained) = run("chained");
    let (dense, n_dense) = run("chained-dense");
    assert_eq!(n_plain, 0);
    // chained-dense keeps a mixture-of-experts model in stream order.
    assert_eq!(n_dense, 0, "chained-dense chained a MoE model's launches");
    assert!(n_chained > 0, "chained chained nothing");
    assert!(chained == plain, "chained decode differs from plain decode");
    assert!(
        dense == plain,
        "chained-dense decode differs from plain decode"
    );
}

/// `moe-preload` chains the step and has the expert GEMVs read what grids
/// before their predecessor wrote ahead of their wait (DOWN: moe_route's
/// ids, then its first weight units; the Q8_0 GATE_UP: x, split into
/// records). Its logits are main's plain ones bit for bit: the same sums
/// in the same order, and a stale id would route to another expert.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_preload_chained_decode_is_bit_identical_to_plain_decode_on_tiny_moe() {
    // Embedded, so the staged test runs from any directory.
    let p = Profile::parse(
        "variants/profiles/moe-preload.toml",
        include_str!("../../variants/profiles/moe-preload.toml"),
    )
    .expect("moe-preload");
    chained_decode_is_plain_decode(p);
}

/// Tiny-moe Q8_0 decoded under `p` (its step chained) gives main's plain
/// decode's logits bit for bit.
fn chained_decode_is_plain_decode(p: Profile) {
    let name = p.name.clone();
    let m = tiny_moe(WeightType::Q8_0);
    let toks = prompt(&m, 70, 7);
    let (plain, _) = decode_bits_with_launch(&m, "plain", &toks, 29);
    let (got, n) = decode_bits_with(&m, p, &toks, 29);
    assert!(n > 0, "{name} chained nothing");
    assert!(got == plain, "{name} decode differs from plain decode");
}

/// `moe-early` launches the router before the shared MLP and has the
/// expert gate|up group, load and split x before its wait (PRELOAD=2):
/// every input it reads is two or more launches back. Its logits are
/// main's plain ones bit for bit: the router's and the shared MLP's inputs
/// are the same buffers, and the sums are the same in the same order.
#[test]
#[ignore = "needs a CUDA GPU"]
fn moe_early_chained_decode_is_bit_identical_to_plain_decode_on_tiny_moe() {
    let p = Profile::parse(
        "variants/profiles/moe-early.toml",
        include_str!("../../variants/profiles/moe-early.toml"),
    )
    .expect("moe-early");
    assert!(p.moe_route_early, "moe-early launches the router early");
    chained_decode_is_plain_decode(p);
}
