//! Helpers of the GPU engine tests (`cuda_parity`, `cuda_moe`): engines
//! built for a test, prompts, and the agreement of two engines' logits.
#![allow(dead_code)]

use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::cuda::{CudaEngine, CudaOptions};
use gemtune_engine::engine::Engine;
use gemtune_engine::forward::{LogitRows, Logits};
use gemtune_engine::model::Model;
use gemtune_engine::profile::Profile;
use rand::{Rng, SeedableRng};

pub fn prompt(model: &Model, n: usize, seed: u64) -> Vec<u32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v = model.vocab_size() as u32;
    (0..n)
        .map(|_| rng.random_range(256.min(v - 1)..v))
        .collect()
}

pub fn cuda<'m>(
    model: &'m Model,
    profile: &str,
    max_seq: usize,
    ubatch: usize,
    graph: bool,
) -> CudaEngine<'m> {
    let p = Profile::load(profile).expect("profile");
    cuda_with(model, p, max_seq, ubatch, graph)
}

pub fn cuda_with(
    model: &Model,
    profile: Profile,
    max_seq: usize,
    ubatch: usize,
    graph: bool,
) -> CudaEngine<'_> {
    let mut o = CudaOptions::new(profile);
    o.max_seq = max_seq;
    o.ubatch = ubatch;
    o.graph = graph;
    CudaEngine::new(model, o)
        .unwrap_or_else(|e| panic!("this test needs a CUDA GPU and NVRTC: {e}"))
}

/// Graph decode of `toks[prefill..]` after a prefill of `toks[..prefill]`
/// under `main` with `decode_launch = launch`: every step's logits as bits,
/// and the launches the engine chained.
pub fn decode_bits_with_launch(
    model: &Model,
    launch: &str,
    toks: &[u32],
    prefill: usize,
) -> (Vec<Vec<u32>>, u64) {
    let text = format!("name = \"{launch}\"\nbase = \"main\"\ndecode_launch = \"{launch}\"\n");
    let p = Profile::parse("decode-launch.toml", &text).expect("profile");
    decode_bits_with(model, p, toks, prefill)
}

/// `decode_bits_with_launch` under `profile`.
pub fn decode_bits_with(
    model: &Model,
    profile: Profile,
    toks: &[u32],
    prefill: usize,
) -> (Vec<Vec<u32>>, u64) {
    let mut e = cuda_with(model, profile, 128, 32, true);
    e.forward(&toks[..prefill], LogitRows::None)
        .expect("prefill");
    let rows = toks[prefill..]
        .iter()
        .map(|&t| {
            let l = e.forward(&[t], LogitRows::Last).expect("decode");
            l.row(0).iter().map(|v| v.to_bits()).collect()
        })
        .collect();
    (rows, e.chained_launches())
}

pub fn cpu(model: &Model, max_seq: usize) -> CpuEngine<'_> {
    CpuEngine::new(
        model,
        CpuOptions {
            max_seq,
            max_batch: 64,
            ..Default::default()
        },
    )
    .expect("cpu engine")
}

/// ||a - b|| / ||b|| over one row.
pub fn rms_rel(a: &[f32], b: &[f32]) -> f64 {
    let (mut e, mut r) = (0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        e += (*x as f64 - *y as f64).powi(2);
        r += (*y as f64).powi(2);
    }
    (e / r.max(1e-30)).sqrt()
}

pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
        .unwrap_or(0)
}

pub struct Agreement {
    pub worst_rms: f64,
    pub top1: f64,
    /// Every compared row's rms_rel, in row order.
    pub rows: Vec<f64>,
}

impl Agreement {
    /// The rms_rel that `q` of the rows stay at or under (nearest rank).
    pub fn quantile(&self, q: f64) -> f64 {
        let mut v = self.rows.clone();
        v.sort_by(f64::total_cmp);
        let i = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len().max(1)) - 1;
        v.get(i).copied().unwrap_or(0.0)
    }
}

pub fn agreement(gpu: &Logits, cpu: &Logits) -> Agreement {
    assert_eq!(gpu.positions, cpu.positions);
    let mut worst: f64 = 0.0;
    let mut same = 0;
    let mut rows = Vec::with_capacity(gpu.n_rows());
    for i in 0..gpu.n_rows() {
        let e = rms_rel(gpu.row(i), cpu.row(i));
        worst = worst.max(e);
        rows.push(e);
        same += (argmax(gpu.row(i)) == argmax(cpu.row(i))) as usize;
    }
    Agreement {
        worst_rms: worst,
        top1: same as f64 / gpu.n_rows().max(1) as f64,
        rows,
    }
}

/// Prefill of `n_prefill` tokens (all rows) then decode steps to 256
/// positions, on both engines; returns the agreement of every row.
pub fn compare_engines(model: &Model, profile: &str, n_prefill: usize, ubatch: usize) -> Agreement {
    let p = Profile::load(profile).expect("profile");
    compare_engines_with(model, p, n_prefill, ubatch)
}

pub fn compare_engines_with(
    model: &Model,
    profile: Profile,
    n_prefill: usize,
    ubatch: usize,
) -> Agreement {
    let total = 256;
    let toks = prompt(model, total, 11);
    let mut c = cpu(model, total);
    let mut g = cuda_with(model, profile, total, ubatch, true);
    let lc = c
        .forward(&toks[..n_prefill], LogitRows::All)
        .expect("cpu prefill");
    let lg = g
        .forward(&toks[..n_prefill], LogitRows::All)
        .expect("gpu prefill");
    let mut a = agreement(&lg, &lc);
    let mut same = (a.top1 * n_prefill as f64).round() as usize;
    for &t in &toks[n_prefill..] {
        let lc = c.forward(&[t], LogitRows::Last).expect("cpu decode");
        let lg = g.forward(&[t], LogitRows::Last).expect("gpu decode");
        let s = agreement(&lg, &lc);
        a.worst_rms = a.worst_rms.max(s.worst_rms);
        a.rows.extend(s.rows);
        same += s.top1 as usize;
    }
    a.top1 = same as f64 / total as f64;
    a
}
