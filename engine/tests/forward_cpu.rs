//! CPU forward invariants on the tiny synthetic model (d 128, layers
//! [S,S,F,S,S,F], window 8, donors 4 -> 3 and 5 -> 2, k_eq_v full layers, PLE).

use std::sync::OnceLock;

use gemtune_engine::config::AttnKind;
use gemtune_engine::cpu::rope;
use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::forward::{ForwardError, LogitRows, Logits};
use gemtune_engine::gguf::{GgufFile, GgufValue, GgufWriter};
use gemtune_engine::model::{MatRef, Model, ModelError};
use gemtune_engine::rope::RopeFreqs;
use gemtune_engine::sampler::{Sampler, SamplerConfig};
use gemtune_engine::synth;
use gemtune_kernels::oracle::{self, AttnParams};
use gemtune_kernels::quant;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn tiny() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| {
        Model::from_gguf(synth::builtin_tiny().expect("builtin tiny")).expect("load tiny")
    })
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let v = tiny().vocab_size() as u32;
    let mut t: Vec<u32> = (0..n).map(|_| rng.random_range(3..v)).collect();
    t[0] = 2;
    t
}

fn engine(mb: usize) -> CpuEngine<'static> {
    let mut e = CpuEngine::new(
        tiny(),
        CpuOptions {
            max_seq: 64,
            max_batch: mb,
            ..Default::default()
        },
    )
    .unwrap();
    e.enable_trace();
    e
}

/// Bit-identical, reporting the largest difference when not.
fn assert_same(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(
        same,
        "{what}: not bit-identical, max relative diff {}",
        rel_diff(a, b)
    );
}

/// Max |a-b| over max |a|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn dequant(m: &Model, w: &MatRef) -> Vec<f32> {
    let mut out = vec![0.0; w.n_in * w.n_out];
    quant::dequantize_row(w.ty, m.mat_bytes(w), &mut out).unwrap();
    out
}

fn project(m: &Model, w: &MatRef, x: &[f32]) -> Vec<f32> {
    let wd = dequant(m, w);
    let mut out = vec![0.0; w.n_out];
    oracle::matmul(&wd, x, 1, w.n_out, w.n_in, &mut out);
    out
}

#[test]
fn tiny_config_has_the_features_under_test() {
    let cfg = tiny().config();
    let kinds: Vec<AttnKind> = cfg.layers.iter().map(|l| l.kind).collect();
    use AttnKind::{Full as F, Sliding as S};
    assert_eq!(kinds, [S, S, F, S, S, F]);
    assert_eq!(cfg.sliding_window, 8);
    assert_eq!(cfg.layers[4].kv_donor, Some(3));
    assert_eq!(cfg.layers[5].kv_donor, Some(2));
    assert!(cfg.layers[2].k_eq_v && tiny().weights().layers[2].attn_v.is_none());
    assert!(cfg.has_ple());
}

#[test]
fn prefill_equals_single_token_decodes_across_the_window() {
    let toks = tokens(20, 1);
    // One batch of 20 (> W = 8, no ring wrap), batches of 3 (ring of 10 slots
    // wraps), and 20 decodes (ring of exactly W slots).
    let mut whole = engine(64);
    let a = whole.forward(&toks, LogitRows::All).unwrap();
    let mut chunked = engine(3);
    let c = chunked.forward(&toks, LogitRows::All).unwrap();
    assert_eq!(chunked.cache().layer(0).unwrap().capacity(), 8 + 3 - 1);
    let mut dec = engine(1);
    assert_eq!(dec.cache().layer(0).unwrap().capacity(), 8);
    let mut rows = Vec::new();
    for &t in &toks {
        let l = dec.forward(&[t], LogitRows::Last).unwrap();
        rows.extend_from_slice(l.last().unwrap());
    }
    // The SWA ring keeps exactly the last W positions; full layers keep all.
    assert_eq!(
        dec.cache().layer(0).unwrap().positions(),
        (12..20).collect::<Vec<_>>()
    );
    assert_eq!(
        dec.cache().layer(2).unwrap().positions(),
        (0..20).collect::<Vec<_>>()
    );
    assert!(dec.cache().layer(0).unwrap().k_at(11).is_none());
    assert_eq!(a.positions, (0..20).collect::<Vec<_>>());
    // Every matmul output is the same fused dot whatever the batch, and the
    // attention visits keys in position order, so the paths agree exactly.
    assert_same(&a.data, &rows, "prefill vs single-token decodes");
    assert_same(&a.data, &c.data, "prefill vs prefill in batches of 3");
    // Every layer, shared ones included, at every position.
    let (ta, td) = (whole.trace().unwrap(), dec.trace().unwrap());
    for l in 0..6 {
        for p in 0..20 {
            assert_same(
                ta.out(l, p).unwrap(),
                td.out(l, p).unwrap(),
                &format!("layer {l} pos {p}"),
            );
        }
    }
    // Last-row-only prefill (shared layers run on one row) gives the same row.
    let mut last = engine(64);
    let l = last.forward(&toks, LogitRows::Last).unwrap();
    assert_eq!(l.positions, vec![19]);
    assert_same(
        a.row(19),
        l.last().unwrap(),
        "slicing before the shared layers",
    );
    // The shared layers only ran for the last row.
    assert_eq!(last.trace().unwrap().layers[4].positions, vec![19]);
    assert_eq!(last.trace().unwrap().layers[3].positions.len(), 20);
}

#[test]
fn prefill_then_decode_continues_the_same_sequence() {
    let toks = tokens(24, 2);
    let mut full = engine(64);
    let a = full.forward(&toks, LogitRows::All).unwrap();
    let mut split = engine(5);
    split.forward(&toks[..17], LogitRows::None).unwrap();
    let mut rows = Vec::new();
    for &t in &toks[17..] {
        rows.extend_from_slice(
            split
                .forward(&[t], LogitRows::Last)
                .unwrap()
                .last()
                .unwrap(),
        );
    }
    assert_same(&a.data[17 * a.vocab..], &rows, "prefill then decode");
}

#[test]
fn the_sliding_window_engages() {
    let w = tiny().config().sliding_window;
    let base = tokens(20, 3);
    let p = 17;
    let run = |toks: &[u32], mb: usize| {
        let mut e = engine(mb);
        e.forward(toks, LogitRows::All).unwrap();
        e.take_trace().unwrap()
    };
    let changed = |at: usize| {
        let mut t = base.clone();
        t[at] = if t[at] == 7 { 8 } else { 7 };
        t
    };
    for mb in [64, 1] {
        let t0 = run(&base, mb);
        // Layer 0 (SWA) at p sees tokens p-W+1 ..= p only.
        let out = run(&changed(p - w), mb);
        assert_eq!(
            out.out(0, p),
            t0.out(0, p),
            "token p-W must not reach layer 0 (mb {mb})"
        );
        assert_ne!(
            out.out(2, p),
            t0.out(2, p),
            "token p-W reaches the full layer 2"
        );
        let inn = run(&changed(p - w + 1), mb);
        assert_ne!(
            inn.out(0, p),
            t0.out(0, p),
            "token p-W+1 is inside layer 0's window"
        );
        // Layer 1 (SWA over layer 0) reaches back 2W-2 tokens.
        let far = run(&changed(p + 1 - 2 * w), mb);
        assert_eq!(far.out(0, p), t0.out(0, p));
        assert_eq!(
            far.out(1, p),
            t0.out(1, p),
            "token p-2W+1 must not reach layer 1"
        );
        let near = run(&changed(p + 2 - 2 * w), mb);
        assert_ne!(near.out(1, p), t0.out(1, p), "token p-2W+2 reaches layer 1");
    }
}

/// Oracle attention of one query row over a cache's positions lo..=p.
fn oracle_attn(e: &CpuEngine, l: usize, p: usize, q: &[f32]) -> Vec<f32> {
    let cfg = tiny().config();
    let lc = &cfg.layers[l];
    let kv = e.cache().for_layer(l);
    let lo = match lc.kind {
        AttnKind::Sliding => (p + 1).saturating_sub(cfg.sliding_window),
        AttnKind::Full => 0,
    };
    let (mut k, mut v, mut kp) = (Vec::new(), Vec::new(), Vec::new());
    for pos in lo..=p {
        k.extend_from_slice(kv.k_at(pos).unwrap());
        v.extend_from_slice(kv.v_at(pos).unwrap());
        kp.push(pos);
    }
    let params = AttnParams {
        n_heads: lc.n_heads,
        n_kv_heads: kv.n_kv_heads(),
        head_dim: lc.head_dim,
        scale: 1.0,
        window: None,
    };
    let mut out = vec![0.0; q.len()];
    oracle::attention(q, &[p], &k, &v, &kp, &params, &mut out);
    out
}

#[test]
fn shared_layers_read_the_donor_cache_and_own_none() {
    let cfg = tiny().config();
    let toks = tokens(13, 4);
    let mut a = engine(64);
    let mut b = engine(64);
    for l in 0..cfg.n_layers {
        assert_eq!(a.cache().owns(l), cfg.layers[l].owns_kv(), "layer {l}");
        assert_eq!(a.cache().owner_of(l), cfg.layers[l].kv_donor.unwrap_or(l));
    }
    assert!(a.cache().layer(4).is_none() && a.cache().layer(5).is_none());
    assert_eq!(a.cache().n_owned(), 4);
    a.forward(&toks[..12], LogitRows::All).unwrap();
    b.forward(&toks[..12], LogitRows::All).unwrap();
    // Consumers' attention equals the oracle over the donor's cache.
    for (cons, donor) in [(4, 3), (5, 2)] {
        assert!(std::ptr::eq(
            a.cache().for_layer(cons),
            a.cache().layer(donor).unwrap()
        ));
        for p in 0..12 {
            let tr = a.trace().unwrap();
            let want = oracle_attn(&a, cons, p, tr.q(cons, p).unwrap());
            let d = rel_diff(&want, tr.attn(cons, p).unwrap());
            assert!(d < 1e-5, "layer {cons} pos {p}: {d}");
        }
    }
    // Perturb the donors' K/V in b's cache inside the next query's reach.
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for v in b.cache_mut().layer_mut(3).unwrap().v_at_mut(10).unwrap() {
        *v += rng.random_range(-1.0..1.0);
    }
    for k in b.cache_mut().layer_mut(2).unwrap().k_at_mut(3).unwrap() {
        *k += rng.random_range(-1.0..1.0);
    }
    a.forward(&toks[12..], LogitRows::Last).unwrap();
    b.forward(&toks[12..], LogitRows::Last).unwrap();
    let (ta, tb) = (a.trace().unwrap(), b.trace().unwrap());
    for l in 0..2 {
        assert_eq!(
            ta.out(l, 12),
            tb.out(l, 12),
            "layers before the donors are untouched"
        );
    }
    for (cons, donor) in [(4, 3), (5, 2)] {
        let (qa, qb) = (ta.q(cons, 12).unwrap(), tb.q(cons, 12).unwrap());
        assert_ne!(
            ta.attn(cons, 12),
            tb.attn(cons, 12),
            "layer {cons} must see donor {donor}'s change"
        );
        let d = rel_diff(&oracle_attn(&b, cons, 12, qb), tb.attn(cons, 12).unwrap());
        assert!(
            d < 1e-5,
            "layer {cons} reads the perturbed donor cache: {d}"
        );
        assert!(rel_diff(&oracle_attn(&a, cons, 12, qa), ta.attn(cons, 12).unwrap()) < 1e-5);
    }
    // The consumers wrote nothing: still no caches of their own, and the
    // perturbed donor entries are as we left them (not rewritten).
    assert!(b.cache().layer(4).is_none() && b.cache().layer(5).is_none());
    assert_ne!(
        a.cache().layer(3).unwrap().v_at(10),
        b.cache().layer(3).unwrap().v_at(10)
    );
}

fn norm_heads(x: &[f32], hd: usize, w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (o, h) in out.chunks_exact_mut(hd).zip(x.chunks_exact(hd)) {
        oracle::rms_norm(h, w, eps, o);
    }
    out
}

#[test]
fn cached_k_and_v_match_an_independent_computation() {
    let m = tiny();
    let cfg = m.config();
    let mut e = engine(64);
    let toks = tokens(11, 5);
    e.forward(&toks, LogitRows::All).unwrap();
    let tr = e.trace().unwrap();
    for l in [0usize, 2] {
        let lc = &cfg.layers[l];
        let lw = &m.weights().layers[l];
        let rc = cfg.rope(lc.kind);
        let hd = lc.head_dim;
        for p in 0..11 {
            let a = tr.attn_in(l, p).unwrap();
            let k_raw = project(m, lw.attn_k.as_ref().unwrap(), a);
            let v_raw = match &lw.attn_v {
                Some(wv) => project(m, wv, a),
                None => k_raw.clone(), // k_eq_v: the raw K projection
            };
            assert_eq!(lw.attn_v.is_none(), lc.k_eq_v);
            let want_v = norm_heads(&v_raw, hd, None, cfg.rms_eps);
            let mut want_k = norm_heads(&k_raw, hd, lw.attn_k_norm.as_deref(), cfg.rms_eps);
            for h in want_k.chunks_exact_mut(hd) {
                oracle::rope_neox(h, p, rc.freq_base, rc.dims, rc.freq_factors.as_deref());
            }
            let kv = e.cache().layer(l).unwrap();
            let dv = rel_diff(&want_v, kv.v_at(p).unwrap());
            let dk = rel_diff(&want_k, kv.k_at(p).unwrap());
            assert!(dv < 1e-5, "layer {l} pos {p}: V differs by {dv}");
            assert!(dk < 1e-5, "layer {l} pos {p}: K differs by {dk}");
            if lc.k_eq_v && p > 0 {
                assert!(
                    rel_diff(kv.k_at(p).unwrap(), kv.v_at(p).unwrap()) > 1e-2,
                    "V must not be the normed/roped K"
                );
            }
            // Queries through the same path (own q_norm, rope at p).
            let mut want_q = norm_heads(
                &project(m, &lw.attn_q, a),
                hd,
                Some(&lw.attn_q_norm),
                cfg.rms_eps,
            );
            for h in want_q.chunks_exact_mut(hd) {
                oracle::rope_neox(h, p, rc.freq_base, rc.dims, rc.freq_factors.as_deref());
            }
            let dq = rel_diff(&want_q, tr.q(l, p).unwrap());
            assert!(dq < 1e-5, "layer {l} pos {p}: Q differs by {dq}");
        }
    }
}

#[test]
fn proportional_rope_rotates_64_pairs_across_the_half_split() {
    let cfg = tiny().config();
    let rc = &cfg.rope_full;
    assert_eq!((rc.dims, rc.freq_base), (512, 1.0e6));
    let f = RopeFreqs::new(rc);
    assert_eq!(f.half(), 256);
    let pos = 37;
    let (mut cos, mut sin) = (vec![0.0; 256], vec![0.0; 256]);
    f.fill(pos, &mut cos, &mut sin);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let x: Vec<f32> = (0..512).map(|_| rng.random_range(-1.0..1.0)).collect();
    let mut y = x.clone();
    rope::apply(&mut y, &cos, &sin);
    for i in 0..256 {
        if i < 64 {
            let ang = pos as f64 * 1.0e6f64.powf(-2.0 * i as f64 / 512.0);
            let (c, s) = (ang.cos(), ang.sin());
            let w0 = x[i] as f64 * c - x[i + 256] as f64 * s;
            let w1 = x[i] as f64 * s + x[i + 256] as f64 * c;
            assert!(
                (y[i] as f64 - w0).abs() < 1e-5 && (y[i + 256] as f64 - w1).abs() < 1e-5,
                "pair {i}"
            );
        } else {
            assert_eq!(
                (y[i], y[i + 256]),
                (x[i], x[i + 256]),
                "pair {i} must pass through"
            );
        }
    }
    // Known frequencies (spec §7): pair 1 turns 0.947464 rad per position.
    f.fill(1, &mut cos, &mut sin);
    assert!((sin[1] as f64 - 0.947464f64.sin()).abs() < 1e-6);
    assert!((sin[63] as f64 - 0.033376f64.sin()).abs() < 1e-6);
    // Same result as the oracle's proportional RoPE.
    let mut o = x.clone();
    oracle::rope_neox(
        &mut o,
        pos,
        rc.freq_base,
        rc.dims,
        rc.freq_factors.as_deref(),
    );
    assert!(rel_diff(&o, &y) < 1e-6);
    // SWA layers: plain RoPE over the whole 256-wide head, θ = 10 000.
    assert_eq!((cfg.rope_swa.dims, cfg.rope_swa.freq_base), (256, 1.0e4));
    let fs = RopeFreqs::new(&cfg.rope_swa);
    assert!((fs.inv_freq[1] - 0.930572).abs() < 1e-6);
}

#[test]
fn activations_stay_finite_and_non_degenerate() {
    let mut e = engine(64);
    let toks = tokens(20, 6);
    let lg = e.forward(&toks, LogitRows::All).unwrap();
    let tr = e.trace().unwrap();
    let d = tiny().config().d_model;
    for l in 0..6 {
        let out = &tr.layers[l].out;
        assert_eq!(out.len(), 20 * d);
        assert!(
            out.iter().all(|v| v.is_finite()),
            "layer {l} has non-finite values"
        );
        for p in 0..20 {
            let row = tr.out(l, p).unwrap();
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / d as f32).sqrt();
            assert!(rms > 1e-4 && rms < 1e4, "layer {l} pos {p}: rms {rms}");
        }
        assert_ne!(tr.out(l, 5), tr.out(l, 6), "layer {l}: rows must differ");
    }
    assert!(lg.data.iter().all(|v| v.is_finite() && v.abs() <= 30.0));
    for r in 0..20 {
        let row = lg.row(r);
        let (mn, mx) = row
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        assert!(mx - mn > 1e-3, "row {r}: logits are flat");
    }
}

fn generate(temp: f32, seed: u64, n: usize) -> Vec<u32> {
    let mut e = CpuEngine::new(tiny(), CpuOptions::default()).unwrap();
    let mut s = Sampler::new(SamplerConfig {
        temperature: temp,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed,
    });
    let mut l: Logits = e.forward(&tokens(5, 7), LogitRows::Last).unwrap();
    let mut out = Vec::new();
    for _ in 0..n {
        let t = s.sample(l.last().unwrap());
        out.push(t);
        l = e.forward(&[t], LogitRows::Last).unwrap();
    }
    out
}

#[test]
fn same_seed_same_output_and_greedy_is_deterministic() {
    let mut a = engine(64);
    let mut b = engine(4);
    let la = a.forward(&tokens(9, 8), LogitRows::All).unwrap();
    let lb = b.forward(&tokens(9, 8), LogitRows::All).unwrap();
    let mut a2 = engine(64);
    assert_eq!(
        la,
        a2.forward(&tokens(9, 8), LogitRows::All).unwrap(),
        "bit-identical reruns"
    );
    assert_same(&la.data, &lb.data, "batch 64 vs batch 4");
    assert_eq!(generate(0.0, 1, 12), generate(0.0, 2, 12));
    assert_eq!(generate(0.9, 42, 12), generate(0.9, 42, 12));
}

#[test]
fn bad_input_is_rejected_before_any_state_changes() {
    let m = tiny();
    let mut e = CpuEngine::new(
        m,
        CpuOptions {
            max_seq: 16,
            max_batch: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert!(matches!(
        e.forward(&[], LogitRows::Last),
        Err(ForwardError::Empty)
    ));
    let vocab = m.vocab_size();
    match e.forward(&[2, vocab as u32], LogitRows::Last) {
        Err(ForwardError::UnknownToken {
            id,
            index: 1,
            vocab: v,
        }) => assert_eq!((id as usize, v), (vocab, vocab)),
        other => panic!("expected UnknownToken, got {other:?}"),
    }
    assert!(matches!(
        e.forward(&tokens(17, 1), LogitRows::Last),
        Err(ForwardError::ContextFull {
            needed: 17,
            max: 16,
            ..
        })
    ));
    assert_eq!(e.position(), 0);
    e.forward(&tokens(16, 1), LogitRows::Last).unwrap();
    assert!(matches!(
        e.forward(&[5], LogitRows::Last),
        Err(ForwardError::ContextFull { needed: 17, .. })
    ));
    // max_seq is capped at the context length.
    let e = CpuEngine::new(
        m,
        CpuOptions {
            max_seq: 1 << 20,
            max_batch: 4,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(e.max_seq(), m.config().context_length);
}

#[test]
fn another_architecture_is_refused() {
    let src = synth::builtin_tiny().unwrap();
    let mut w = GgufWriter::from_file(&src);
    w.add_metadata("general.architecture", GgufValue::String("llama".into()));
    let bytes = w
        .write_to_vec(|i, _, dst: &mut [u8]| {
            dst.copy_from_slice(src.tensor_data(&src.tensors()[i]));
            Ok::<(), String>(())
        })
        .unwrap();
    let f = GgufFile::from_bytes(bytes, "llama.gguf").unwrap();
    let err = Model::from_gguf(f).unwrap_err();
    assert!(matches!(err, ModelError::WrongArchitecture { .. }), "{err}");
    assert!(err.to_string().contains("'llama'"), "{err}");
}

/// Spec §3 written out plainly with the f64 oracle ops over the whole
/// sequence at once (no cache, no batching, no ring): the engine must agree.
fn reference_logits(m: &Model, toks: &[u32]) -> Vec<f32> {
    let cfg = m.config();
    let w = m.weights();
    let (d, n, eps) = (cfg.d_model, toks.len(), cfg.rms_eps);
    let norm = |x: &[f32], wt: Option<&[f32]>| {
        let mut o = vec![0.0; x.len()];
        oracle::rms_norm(x, wt, eps, &mut o);
        o
    };
    let rows = |mat: &MatRef, x: &[f32]| {
        let wd = dequant(m, mat);
        let mut o = vec![0.0; x.len() / mat.n_in * mat.n_out];
        oracle::matmul(&wd, x, x.len() / mat.n_in, mat.n_out, mat.n_in, &mut o);
        o
    };
    let emb = dequant(m, &w.token_embd);
    let mut x: Vec<f32> = toks
        .iter()
        .flat_map(|&t| {
            emb[t as usize * d..(t as usize + 1) * d]
                .iter()
                .map(|v| v * (d as f32).sqrt())
        })
        .collect();
    let pw = w.ple.as_ref().unwrap();
    let (pd, lp) = (cfg.ple_dim, cfg.n_layers * cfg.ple_dim);
    let table = dequant(m, &pw.token_embd);
    let proj = rows(&pw.model_proj, &x);
    let mut ple = vec![0.0f32; n * lp];
    for t in 0..n {
        for c in 0..cfg.n_layers {
            let o = t * lp + c * pd;
            let scaled: Vec<f32> = proj[o..o + pd]
                .iter()
                .map(|v| v / (d as f32).sqrt())
                .collect();
            let pn = norm(&scaled, Some(&pw.proj_norm));
            for i in 0..pd {
                let tok = table[toks[t] as usize * lp + c * pd + i] * (pd as f32).sqrt();
                ple[o + i] = (pn[i] + tok) * std::f32::consts::FRAC_1_SQRT_2;
            }
        }
    }
    let pos: Vec<usize> = (0..n).collect();
    let mut kv: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; cfg.n_layers];
    for (l, (lc, lw)) in cfg.layers.iter().zip(&w.layers).enumerate() {
        let hd = lc.head_dim;
        let rc = cfg.rope(lc.kind);
        let rope_all = |v: &mut Vec<f32>, width: usize| {
            for t in 0..n {
                for h in v[t * width..(t + 1) * width].chunks_exact_mut(hd) {
                    oracle::rope_neox(h, t, rc.freq_base, rc.dims, rc.freq_factors.as_deref());
                }
            }
        };
        let a: Vec<f32> = x
            .chunks_exact(d)
            .flat_map(|r| norm(r, Some(&lw.attn_norm)))
            .collect();
        let mut q: Vec<f32> = rows(&lw.attn_q, &a)
            .chunks_exact(hd)
            .flat_map(|h| norm(h, Some(&lw.attn_q_norm)))
            .collect();
        rope_all(&mut q, lc.q_dim());
        if lc.owns_kv() {
            let k_raw = rows(lw.attn_k.as_ref().unwrap(), &a);
            let v_raw = lw
                .attn_v
                .as_ref()
                .map_or_else(|| k_raw.clone(), |wv| rows(wv, &a));
            let mut k: Vec<f32> = k_raw
                .chunks_exact(hd)
                .flat_map(|h| norm(h, lw.attn_k_norm.as_deref()))
                .collect();
            rope_all(&mut k, lc.kv_dim());
            let v: Vec<f32> = v_raw.chunks_exact(hd).flat_map(|h| norm(h, None)).collect();
            kv[l] = Some((k, v));
        }
        let (k, v) = kv[lc.kv_donor.unwrap_or(l)].clone().unwrap();
        let params = AttnParams {
            n_heads: lc.n_heads,
            n_kv_heads: k.len() / n / hd,
            head_dim: hd,
            scale: 1.0,
            window: (lc.kind == AttnKind::Sliding).then_some(cfg.sliding_window),
        };
        let mut o = vec![0.0; q.len()];
        oracle::attention(&q, &pos, &k, &v, &pos, &params, &mut o);
        let attn = rows(&lw.attn_output, &o);
        let (g, u, dn) = (
            dequant(m, &lw.ffn_gate),
            dequant(m, &lw.ffn_up),
            dequant(m, &lw.ffn_down),
        );
        let pl = lw.ple.as_ref().unwrap();
        for t in 0..n {
            let h = &mut x[t * d..(t + 1) * d];
            for (hv, y) in h.iter_mut().zip(norm(
                &attn[t * d..(t + 1) * d],
                Some(&lw.post_attention_norm),
            )) {
                *hv += y;
            }
            let mut f = vec![0.0; d];
            oracle::gated_ffn(
                &norm(h, Some(&lw.ffn_norm)),
                &g,
                &u,
                &dn,
                d,
                lc.ffn_dim,
                &mut f,
            );
            for (hv, y) in h.iter_mut().zip(norm(&f, Some(&lw.post_ffw_norm))) {
                *hv += y;
            }
            let gate: Vec<f32> = rows(&pl.inp_gate, h)
                .iter()
                .zip(&ple[t * lp + l * pd..t * lp + (l + 1) * pd])
                .map(|(&a, &b)| oracle::gelu_tanh(a) * b)
                .collect();
            let p = rows(&pl.proj, &gate);
            for (hv, y) in h.iter_mut().zip(norm(&p, Some(&pl.post_norm))) {
                *hv += y;
            }
            for hv in h.iter_mut() {
                *hv *= lw.layer_scale;
            }
        }
    }
    let y: Vec<f32> = x
        .chunks_exact(d)
        .flat_map(|r| norm(r, Some(&w.output_norm)))
        .collect();
    let cap = cfg.final_logit_softcap.unwrap();
    rows(&w.token_embd, &y)
        .into_iter()
        .map(|v| oracle::softcap(v, cap))
        .collect()
}

#[test]
fn engine_matches_a_plain_oracle_forward() {
    let m = tiny();
    assert!(
        m.weights().layers.iter().any(|l| l.layer_scale != 1.0),
        "layer scalars must be exercised"
    );
    let toks = tokens(19, 13);
    let want = reference_logits(m, &toks);
    for mb in [64, 4] {
        let mut e = CpuEngine::new(
            m,
            CpuOptions {
                max_seq: 32,
                max_batch: mb,
                ..Default::default()
            },
        )
        .unwrap();
        let got = e.forward(&toks, LogitRows::All).unwrap();
        let dd = rel_diff(&want, &got.data);
        eprintln!("engine (batch {mb}) vs oracle forward: max |diff| / max |logit| = {dd:.2e}");
        assert!(dd < 1e-4, "engine (batch {mb}) vs oracle forward: {dd}");
    }
}

/// Prefill of 13 tokens (groups of the many-token kernel plus a remainder)
/// equals 13 single-token decodes, bit for bit, for every synth weight type.
#[test]
fn prefill_equals_decodes_for_every_weight_type() {
    let toks = tokens(13, 5);
    for w in synth::WeightType::ALL {
        let bytes =
            synth::synth_to_vec(synth::SynthVariant::Tiny, w, synth::SynthOptions::default())
                .expect("synth tiny");
        let file = GgufFile::from_bytes(bytes, "tiny").expect("parse tiny");
        let model = Model::from_gguf(file).expect("load tiny");
        let opts = |mb| CpuOptions {
            max_seq: 64,
            max_batch: mb,
            ..Default::default()
        };
        let mut whole = CpuEngine::new(&model, opts(64)).unwrap();
        let a = whole.forward(&toks, LogitRows::All).unwrap();
        let mut dec = CpuEngine::new(&model, opts(1)).unwrap();
        let mut rows = Vec::new();
        for &t in &toks {
            let l = dec.forward(&[t], LogitRows::Last).unwrap();
            rows.extend_from_slice(l.last().unwrap());
        }
        assert_same(&a.data, &rows, &format!("{w:?}: prefill vs decodes"));
    }
}

/// `RowWork::Full` runs every layer over every prompt row and the default
/// runs the layers from the first KV-shared one over the wanted row only;
/// both match `work::forward_work`, and the wanted logits are the same bits
/// (every stage is row-independent, so the trimmed rows change nothing the
/// kept row computes).
#[test]
fn full_work_runs_every_row_and_changes_no_logit() {
    use gemtune_engine::work::{forward_work, RowWork};
    let m = tiny();
    let cfg = m.config();
    let from = cfg.compact_from();
    assert!(from < cfg.n_layers, "tiny shares KV from layer {from}");
    let toks = tokens(37, 11);
    let run = |row_work: RowWork| {
        let mut e = CpuEngine::new(
            m,
            CpuOptions {
                max_seq: 64,
                max_batch: 16,
                row_work,
            },
        )
        .unwrap();
        let l = e.forward(&toks, LogitRows::Last).unwrap();
        (l, e.rows_run().clone())
    };
    let (trim_logits, trim_rows) = run(RowWork::Trimmed);
    let (full_logits, full_rows) = run(RowWork::Full);
    assert_eq!(trim_logits.data, full_logits.data);
    for (rw, rows) in [(RowWork::Trimmed, &trim_rows), (RowWork::Full, &full_rows)] {
        let w = forward_work(cfg, 0, toks.len(), 16, LogitRows::Last, rw);
        assert_eq!(rows.layers, w.layer_rows, "{rw:?}");
        assert_eq!(rows.head, w.head_rows, "{rw:?}");
    }
    // Chunks of 16, 16 and 5: the first two want no logits and stop at
    // the trim; the last carries one row from there.
    for (l, (&t, &f)) in trim_rows.layers.iter().zip(&full_rows.layers).enumerate() {
        assert_eq!(f, 37, "layer {l} under full work");
        assert_eq!(t, if l < from { 37 } else { 1 }, "layer {l} trimmed");
    }
}
