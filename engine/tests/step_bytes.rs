//! The bytes of a decode step (`step_bytes`, bench's floor) against an
//! independent count: for the tiny and E4B shapes, Q8_0 and Q4_0, the
//! CUDA plan's `StepReads` must equal the sum over the tensor list of what
//! a one-token step reads (every used matrix in its device type, the tied
//! head, one embedding and one PLE row, the norm vectors) plus the KV
//! cache at the step's position and the logits, each counted here from the
//! tensor list and the layer configs, not through the engine's functions.
//! No GPU: plans are resolved for sm_90.

use gemtune_engine::config::{AttnKind, Gemma4Config};
use gemtune_engine::cuda::forward_plan::{ForwardPlan, MatmulExec, MatmulPlan, Sizing};
use gemtune_engine::cuda::model_dims::ModelDims;
use gemtune_engine::cuda::{step_reads, Planner};
use gemtune_engine::engine::Engine;
use gemtune_engine::plan::{tensor_plan, TensorRole};
use gemtune_engine::profile::Profile;
use gemtune_engine::step_bytes::StepBytes;
use gemtune_engine::synth::{self, tensor_type, SynthVariant, WeightType};
use gemtune_kernels::bind::matmul::{ScaleType, WeightLayout};
use gemtune_kernels::compile::Arch;
use gemtune_kernels::family::{DeviceLimits, KvType};
use gemtune_kernels::quant::GgmlType;

fn plan(profile: &str, cfg: &Gemma4Config, wt: WeightType, kv: KvType) -> (ForwardPlan, ModelDims) {
    let planner = Planner::new(
        Profile::load(profile).expect("profile"),
        None,
        DeviceLimits::for_arch(Arch(90)),
    );
    let embd = wt.embedding_type(cfg.d_model as u64);
    let dims = ModelDims::from_config(cfg, wt.matrix_type(), embd, &planner);
    let max_seq = 4096.min(cfg.context_length);
    let sizing = Sizing {
        max_seq,
        ubatch: 512.min(max_seq),
        kv_type: kv,
    };
    let p = ForwardPlan::resolve(&planner, cfg, &dims, sizing).expect("plan");
    (p, dims)
}

/// Every projection of the one-row bucket reads its matrix as GGUF blocks
/// or as planes with f16 scales: both are the GGUF bytes of the device
/// type for Q8_0 / Q4_0, which is what `expected` counts (the head's Q6_K
/// planes are counted as such, `Head`).
fn assert_gguf_sized_layouts(p: &ForwardPlan) {
    let b = p.bucket(1).expect("one-row bucket");
    let mut all: Vec<&MatmulPlan> = Vec::new();
    for l in &b.layers {
        all.extend(&l.qkv);
        all.extend([&l.o, &l.gate_up, &l.down]);
        if let Some(x) = &l.ple {
            all.extend([&x.gate, &x.proj]);
        }
    }
    all.extend(b.per_layer_inputs.as_ref().map(|x| &x.model_proj));
    all.extend(b.head.as_ref().map(|h| &h.matmul));
    for m in all {
        match &m.exec {
            MatmulExec::Kernel { binding, .. } => assert!(
                matches!(
                    binding.layout,
                    WeightLayout::GgufBlocks
                        | WeightLayout::Planes {
                            scales: ScaleType::F16
                        }
                ),
                "{}: {:?}",
                m.slot,
                binding.layout
            ),
            other => panic!("{}: a one-row launch planned as {other:?}", m.slot),
        }
    }
}

/// GGUF bytes of `n` elements of `t`.
fn gguf_bytes(t: GgmlType, n: u64) -> u64 {
    n / t.block_size() as u64 * t.type_size() as u64
}

/// The step at `pos` counted from the tensor list of `cfg` stored as `wt`,
/// with the head read as `head` and the cache of `kv_elem`-byte elements.
fn expected(cfg: &Gemma4Config, wt: WeightType, head: Head, kv_elem: u64, pos: usize) -> StepBytes {
    let mut s = StepBytes::default();
    for t in tensor_plan(cfg).iter().filter(|t| t.used) {
        let file = tensor_type(t, wt);
        match t.role {
            TensorRole::Matrix => {
                // Matrices are uploaded as Q4_0 when stored so, else Q8_0.
                let dev = if file == GgmlType::Q4_0 {
                    GgmlType::Q4_0
                } else {
                    GgmlType::Q8_0
                };
                s.matrices += gguf_bytes(dev, t.n_elements());
            }
            TensorRole::Embedding => {
                // One row gathered per token; the file types the synthetic
                // writer uses are all ones the gather kernels read as is.
                s.rows += gguf_bytes(file, t.dims[0]);
                if t.name == "token_embd.weight" {
                    s.matrices += t.n_elements() / 256 * head.1;
                }
            }
            TensorRole::Vector => s.vectors += 4 * t.n_elements(),
            // Read per layer from the engine's own f32 array, present or not.
            TensorRole::Scalar => {}
            // The engine rotates with f64 tables of its own (below).
            TensorRole::RopeFreqs => {}
            TensorRole::Router | TensorRole::Experts => {
                panic!("{}: the CUDA engine runs no MoE model", t.name)
            }
        }
    }
    s.vectors += 4 * cfg.n_layers as u64;
    for kind in [AttnKind::Sliding, AttnKind::Full] {
        if let Some(l) = cfg.layers.iter().find(|l| l.kind == kind) {
            s.vectors += (l.head_dim / 2 * 8) as u64;
        }
    }
    for l in &cfg.layers {
        let src = &cfg.layers[l.kv_donor.unwrap_or(l.index)];
        let keys = match src.kind {
            AttnKind::Full => pos + 1,
            AttnKind::Sliding => (pos + 1).min(cfg.sliding_window),
        };
        let row = (src.n_kv_heads * src.head_dim) as u64 * kv_elem;
        s.kv_read += 2 * keys as u64 * row;
        if l.kv_donor.is_none() {
            s.kv_write += 2 * row;
        }
    }
    s.logits = 4 * cfg.vocab_size as u64;
    s
}

/// The head's device type and its bytes per 256 elements in the layout the
/// one-row bucket reads.
type Head = (GgmlType, u64);
/// Q8_0 planes with f16 scales: 8 blocks of 32 quants and a 2-byte scale.
const HEAD_Q8_0: Head = (GgmlType::Q8_0, 8 * 34);
/// Q6_K GGUF super-blocks, the embedding table's own bytes.
const HEAD_Q6K_BLOCKS: Head = (GgmlType::Q6K, 210);
/// The Q6_K plane repack: 128 nibble bytes and an 88-byte GEMV side record.
const HEAD_Q6K_PLANES: Head = (GgmlType::Q6K, 128 + 88);

fn check(v: SynthVariant, wt: WeightType, profile: &str, kv: KvType, head: Head) {
    let cfg = synth::preset(v);
    let (p, dims) = plan(profile, &cfg, wt, kv);
    assert_gguf_sized_layouts(&p);
    assert_eq!(
        dims.head.2,
        head.0,
        "{} {} {profile}: head type",
        v.name(),
        wt.name()
    );
    let r = step_reads::of_plan(&p, &cfg, &dims).expect("step reads");
    let w = cfg.sliding_window;
    for pos in [0, 1, w - 1, w, w + 1, 3 * w + 5, p.sizing.max_seq - 1] {
        let want = expected(&cfg, wt, head, kv.bytes() as u64, pos);
        assert_eq!(
            r.step(&cfg, pos),
            want,
            "{} {} {profile} at position {pos}",
            v.name(),
            wt.name()
        );
    }
    // A tg row: the mean of its steps.
    let n = 3 * w;
    let mean_kv: u64 = (w..w + n)
        .map(|pos| expected(&cfg, wt, head, kv.bytes() as u64, pos).kv_read)
        .sum::<u64>()
        / n as u64;
    assert_eq!(r.mean_step(&cfg, w, n).kv_read, mean_kv);
}

#[test]
fn tiny_step_bytes_equal_the_tensor_list_sum() {
    check(
        SynthVariant::Tiny,
        WeightType::Q8_0,
        "main",
        KvType::F16,
        HEAD_Q8_0,
    );
    // Tiny rows (128) are not whole Q6_K super-blocks: its Q4_0 file keeps
    // the embedding in Q8_0, and so does the head.
    check(
        SynthVariant::Tiny,
        WeightType::Q4_0,
        "main",
        KvType::F16,
        HEAD_Q8_0,
    );
    check(
        SynthVariant::Tiny,
        WeightType::Q8_0,
        "strict",
        KvType::F32,
        HEAD_Q8_0,
    );
}

#[test]
fn e4b_step_bytes_equal_the_tensor_list_sum() {
    check(
        SynthVariant::E4b,
        WeightType::Q8_0,
        "main",
        KvType::F16,
        HEAD_Q8_0,
    );
    // Q4_0 files store the tied embedding as Q6_K: main reads the head
    // from its own Q6_K plane repack (which the gather shares), q8-head
    // converts it to Q8_0 planes (`head_convert`), q6k-head reads the
    // table's blocks.
    check(
        SynthVariant::E4b,
        WeightType::Q4_0,
        "main",
        KvType::F16,
        HEAD_Q6K_PLANES,
    );
    check(
        SynthVariant::E4b,
        WeightType::Q4_0,
        "q8-head",
        KvType::F16,
        HEAD_Q8_0,
    );
    check(
        SynthVariant::E4b,
        WeightType::Q4_0,
        "q6k-head",
        KvType::F16,
        HEAD_Q6K_BLOCKS,
    );
}

#[test]
fn e4b_q8_0_weights_are_the_published_size() {
    // The figure issue 22 quotes for E4B Q8_0: about 4.94 GB a step.
    let cfg = synth::preset(SynthVariant::E4b);
    let (p, dims) = plan("main", &cfg, WeightType::Q8_0, KvType::F16);
    let s = step_reads::of_plan(&p, &cfg, &dims)
        .expect("step reads")
        .step(&cfg, 0);
    let gb = s.total() as f64 / 1e9;
    assert!((4.8..5.1).contains(&gb), "E4B Q8_0 step: {gb:.3} GB");
}

#[test]
fn the_cpu_engine_reads_the_file_bytes_and_an_f32_cache() {
    let f = synth::builtin_tiny().expect("tiny");
    let model = gemtune_engine::model::Model::from_gguf(f).expect("load");
    let cfg = model.config().clone();
    let e = gemtune_engine::cpu::CpuEngine::new(
        &model,
        gemtune_engine::cpu::CpuOptions {
            max_seq: 64,
            max_batch: 8,
            ..Default::default()
        },
    )
    .expect("cpu engine");
    let r = e.step_reads().expect("the CPU engine accounts its reads");
    let file = model.file();
    let bytes = |name: &str| file.tensor(name).map_or(0, |t| t.n_bytes());
    let mut matrices = bytes("token_embd.weight");
    let mut rows = 0;
    for t in tensor_plan(&cfg).iter().filter(|t| t.used) {
        match t.role {
            TensorRole::Matrix => matrices += bytes(&t.name),
            TensorRole::Embedding => rows += bytes(&t.name) / cfg.vocab_size as u64,
            _ => {}
        }
    }
    assert_eq!((r.matrices, r.rows, r.kv_elem), (matrices, rows, 4));
    assert_eq!(r.logits, 4 * cfg.vocab_size as u64);
}
