//! The sampler: greedy ties, determinism, each filter on a hand-made
//! distribution, and the filter order.

use gemtune_engine::sampler::{argmax, Sampler, SamplerConfig};

fn cfg(temperature: f32, top_k: usize, top_p: f32, min_p: f32, seed: u64) -> SamplerConfig {
    SamplerConfig {
        temperature,
        top_k,
        top_p,
        min_p,
        seed,
    }
}

/// Logits whose softmax is [0.5, 0.3, 0.15, 0.05].
fn four() -> Vec<f32> {
    [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect()
}

fn kept(c: SamplerConfig, logits: &[f32]) -> Vec<u32> {
    Sampler::new(c)
        .filtered(logits)
        .into_iter()
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn greedy_takes_the_max_and_breaks_ties_low() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&[1.0, 3.0, 3.0, 2.0]), 1);
    assert_eq!(s.sample(&[f32::NAN, -1.0, -2.0]), 1);
    assert_eq!(s.sample(&[-5.0, -5.0]), 0);
    assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
    assert_eq!(argmax(&[0.0, f32::INFINITY, f32::INFINITY]), 1);
    // Greedy ignores the filters and the seed.
    let mut s = Sampler::new(cfg(0.0, 1, 0.1, 0.9, 99));
    assert_eq!(s.sample(&four()), 0);
}

#[test]
fn same_seed_same_tokens() {
    let logits: Vec<f32> = (0..50).map(|i| (i % 7) as f32 * 0.1).collect();
    let draw = |seed| {
        let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, seed));
        (0..200).map(|_| s.sample(&logits)).collect::<Vec<u32>>()
    };
    assert_eq!(draw(42), draw(42));
    assert_ne!(draw(42), draw(43));
    // Reseeding restarts the stream.
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 42));
    let first: Vec<u32> = (0..20).map(|_| s.sample(&logits)).collect();
    s.reseed(42);
    let again: Vec<u32> = (0..20).map(|_| s.sample(&logits)).collect();
    assert_eq!(first, again);
}

#[test]
fn top_k_keeps_the_k_largest() {
    assert_eq!(kept(cfg(1.0, 2, 1.0, 0.0, 0), &four()), [0, 1]);
    assert_eq!(kept(cfg(1.0, 0, 1.0, 0.0, 0), &four()), [0, 1, 2, 3]);
    assert_eq!(kept(cfg(1.0, 10, 1.0, 0.0, 0), &four()), [0, 1, 2, 3]);
    // Ties at the cut go to the lower id.
    assert_eq!(
        kept(cfg(1.0, 2, 1.0, 0.0, 0), &[1.0, 2.0, 1.0, 1.0]),
        [1, 0]
    );
    let mut s = Sampler::new(cfg(1.0, 2, 1.0, 0.0, 5));
    for _ in 0..1000 {
        assert!(s.sample(&four()) < 2);
    }
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    assert_eq!(kept(cfg(1.0, 0, 0.4, 0.0, 0), &four()), [0]);
    assert_eq!(kept(cfg(1.0, 0, 0.7, 0.0, 0), &four()), [0, 1]);
    assert_eq!(kept(cfg(1.0, 0, 0.9, 0.0, 0), &four()), [0, 1, 2]);
    assert_eq!(kept(cfg(1.0, 0, 0.0, 0.0, 0), &four()), [0]);
}

#[test]
fn min_p_keeps_tokens_near_the_top() {
    // Threshold 0.35 * 0.5 = 0.175.
    assert_eq!(kept(cfg(1.0, 0, 1.0, 0.35, 0), &four()), [0, 1]);
    // Threshold 0.2 * 0.5 = 0.1.
    assert_eq!(kept(cfg(1.0, 0, 1.0, 0.2, 0), &four()), [0, 1, 2]);
    assert_eq!(kept(cfg(1.0, 0, 1.0, 1.0, 0), &four()), [0]);
}

#[test]
fn filters_run_top_k_then_top_p_on_the_renormalized_rest() {
    // After top-k 2 the mass is [0.625, 0.375]: top-p 0.6 keeps one token.
    // (top-p first would keep two.)
    assert_eq!(kept(cfg(1.0, 2, 0.6, 0.0, 0), &four()), [0]);
    // The temperature does not change what the filters keep.
    assert_eq!(kept(cfg(10.0, 0, 0.7, 0.0, 0), &four()), [0, 1]);
    assert_eq!(kept(cfg(0.1, 0, 1.0, 0.35, 0), &four()), [0, 1]);
}

#[test]
fn temperature_reshapes_the_distribution() {
    let logits = [2.0f32, 1.0, 0.0];
    let hist = |t: f32, n: usize| {
        let mut s = Sampler::new(cfg(t, 0, 1.0, 0.0, 11));
        let mut h = [0usize; 3];
        for _ in 0..n {
            h[s.sample(&logits) as usize] += 1;
        }
        h
    };
    // Near-zero temperature: always the top token.
    assert_eq!(hist(0.05, 1000), [1000, 0, 0]);
    // T = 1 matches the softmax [0.665, 0.245, 0.090] within 2 points.
    let h = hist(1.0, 20_000);
    let expect = [0.665, 0.245, 0.090];
    for i in 0..3 {
        let f = h[i] as f64 / 20_000.0;
        assert!(
            (f - expect[i]).abs() < 0.02,
            "token {i}: {f} vs {}",
            expect[i]
        );
    }
    // High temperature: close to uniform.
    let h = hist(100.0, 30_000);
    for c in h {
        assert!((c as f64 / 30_000.0 - 1.0 / 3.0).abs() < 0.02, "{h:?}");
    }
}

#[test]
fn impossible_tokens_are_never_drawn() {
    let logits = [f32::NEG_INFINITY, 0.0, f32::NAN, 0.0];
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 3));
    for _ in 0..500 {
        let id = s.sample(&logits);
        assert!(id == 1 || id == 3, "{id}");
    }
    // A +inf logit wins outright.
    let mut s = Sampler::new(cfg(1.0, 0, 1.0, 0.0, 3));
    assert_eq!(s.sample(&[0.0, f32::INFINITY, 5.0]), 1);
}
