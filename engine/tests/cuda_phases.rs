//! Phase timing of graph decode (`--profile-phases`), on a GPU.
//!
//! Every test needs a CUDA GPU (and NVRTC) and is ignored by default; run
//! with `--include-ignored` on a GPU host. Without a GPU they fail.
//!
//! With phases on, decode steps replay a timed copy of the decode graph
//! (an event-record node at every phase mark). It must compute what the
//! untimed graph computes, bit for bit; its phases must be those of eager
//! decode, mark for mark; and per step they must fill the replay's GPU
//! span (events recorded around each launch, outside the graph) to within
//! 5 %, never more than it, inside the step's wall time.

use std::time::Instant;

use gemtune_engine::cuda::{CudaEngine, CudaOptions};
use gemtune_engine::engine::{Engine, PhaseTimes};
use gemtune_engine::forward::LogitRows;
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
use gemtune_engine::synth::{self, SynthOptions, SynthVariant, WeightType};

fn tiny() -> Model {
    Model::from_gguf(synth::builtin_tiny().expect("tiny model")).expect("load tiny")
}

/// E2B's layers with a small vocabulary: a step of a few milliseconds.
fn e2b_shaped() -> Model {
    let bytes = synth::synth_to_vec(
        SynthVariant::E2b,
        WeightType::Q8_0,
        SynthOptions {
            vocab: Some(4096),
            seed: 3,
        },
    )
    .expect("synth e2b");
    Model::from_gguf(GgufFile::from_bytes(bytes, "e2b-shaped").expect("gguf")).expect("load")
}

fn engine(model: &Model, graph: bool, phases: bool) -> CudaEngine<'_> {
    let mut o = CudaOptions::new(Profile::load("main").expect("profile"));
    o.max_seq = 256;
    o.ubatch = 64;
    o.graph = graph;
    o.phases = phases;
    CudaEngine::new(model, o)
        .unwrap_or_else(|e| panic!("this test needs a CUDA GPU and NVRTC: {e}"))
}

const PROMPT: usize = 20;
const STEPS: usize = 24;

/// Prefills the prompt, then decodes `STEPS` tokens: the decode logits, the
/// decode steps' phases and their wall time in ms.
fn decode(e: &mut CudaEngine<'_>, tokens: &[u32]) -> (Vec<f32>, Option<PhaseTimes>, f64) {
    e.reset();
    e.forward(&tokens[..PROMPT], LogitRows::Last)
        .expect("prefill");
    let _ = e.take_phases();
    let mut logits = Vec::new();
    let t = Instant::now();
    for &tok in &tokens[PROMPT..] {
        logits.extend(e.forward(&[tok], LogitRows::Last).expect("decode").data);
    }
    let ms = t.elapsed().as_secs_f64() * 1e3;
    (logits, e.take_phases(), ms)
}

fn tokens(model: &Model) -> Vec<u32> {
    let v = model.vocab_size() as u32;
    (0..(PROMPT + STEPS) as u32)
        .map(|i| 256 + (i * 7919) % (v - 256))
        .collect()
}

fn check(name: &str, model: &Model) {
    let toks = tokens(model);
    let (want, none, _) = decode(&mut engine(model, true, false), &toks);
    assert!(none.is_none(), "{name}: phases off measure nothing");

    let mut timed = engine(model, true, true);
    let (got, phases, wall_ms) = decode(&mut timed, &toks);
    let p = phases.expect("phases measured");
    assert!(
        got.iter()
            .map(|x| x.to_bits())
            .eq(want.iter().map(|x| x.to_bits())),
        "{name}: the timed graph's logits differ from the untimed graph's"
    );
    assert_eq!(timed.graph_replays(), 0, "{name}: the untimed graph ran");
    assert_eq!(timed.timed_graph_replays(), STEPS as u64, "{name}");
    assert_eq!(p.graph_steps, STEPS, "{name}");

    // The phases of eager decode, mark for mark, but one: eager decode
    // ends the layer before the row compaction without the next input
    // norm and runs that norm on its own, one more `norm` mark per step
    // on models with KV-shared layers.
    let (eager_logits, eager, _) = decode(&mut engine(model, false, true), &toks);
    assert_eq!(eager_logits.len(), want.len());
    let eager = eager.expect("eager phases");
    let marks = |p: &PhaseTimes| -> Vec<(String, usize)> {
        let mut v: Vec<(String, usize)> = p.phases.iter().map(|x| (x.0.clone(), x.2)).collect();
        v.sort();
        v
    };
    let extra = if model.config().compact_from() < model.config().n_layers {
        STEPS
    } else {
        0
    };
    let expect: Vec<(String, usize)> = marks(&eager)
        .into_iter()
        .map(|(n, c)| if n == "norm" { (n, c - extra) } else { (n, c) })
        .collect();
    assert_eq!(marks(&p), expect, "{name}: graph and eager phases");

    let sum = p.total_ms();
    eprintln!(
        "{name}: per step, phases {:.4} ms, replay {:.4} ms, wall {:.4} ms (eager phases {:.4} ms)",
        sum / STEPS as f64,
        p.graph_ms / STEPS as f64,
        wall_ms / STEPS as f64,
        eager.total_ms() / STEPS as f64
    );
    assert!(
        sum <= p.graph_ms * 1.0001 && sum >= 0.95 * p.graph_ms,
        "{name}: phases {sum:.4} ms against replays of {:.4} ms",
        p.graph_ms
    );
    assert!(
        p.graph_ms <= wall_ms,
        "{name}: replays {:.4} ms in {wall_ms:.4} ms",
        p.graph_ms
    );

    // Turned off and on again, the timing keeps its graph: no second capture.
    assert!(timed.set_phases(false));
    let (again, _, _) = decode(&mut timed, &toks);
    assert_eq!(
        timed.graph_replays(),
        STEPS as u64,
        "{name}: untimed graph while off"
    );
    assert!(again
        .iter()
        .map(|x| x.to_bits())
        .eq(want.iter().map(|x| x.to_bits())));
    assert!(timed.set_phases(true));
    assert_eq!(
        timed.timed_graph_replays(),
        STEPS as u64,
        "{name}: the parked graph"
    );
    let (_, p2, _) = decode(&mut timed, &toks);
    assert_eq!(timed.timed_graph_replays(), 2 * STEPS as u64, "{name}");
    assert_eq!(p2.expect("phases").graph_steps, STEPS);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn timed_graph_decode_is_exact_and_its_phases_fill_the_replay_on_tiny() {
    check("tiny", &tiny());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn timed_graph_decode_is_exact_and_its_phases_fill_the_replay_on_an_e2b_shaped_model() {
    check("e2b", &e2b_shaped());
}
