//! The synthetic weights are realistic enough to run: a reference forward
//! of the built-in tiny model, written with the oracle ops (spec §3), keeps
//! every layer's residual stream finite, O(1) and different per token, the
//! attention softmax away from one-hot, and the logits spread out.

use gemtune_engine::config::{AttnKind, Gemma4Config};
use gemtune_engine::gguf::GgufFile;
use gemtune_engine::synth::builtin_tiny;
use gemtune_kernels::oracle::{
    attention, gated_ffn, gelu_tanh, matmul, rms_norm, rope_neox, softcap, AttnParams,
};
use gemtune_kernels::quant::dequantize_row;

fn weights(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    let mut out = vec![0f32; t.n_elements() as usize];
    dequantize_row(t.ty, f.tensor_data(t), &mut out).unwrap();
    out
}

fn lw(f: &GgufFile, l: usize, s: &str) -> Vec<f32> {
    weights(f, &format!("blk.{l}.{s}.weight"))
}

fn rms(x: &[f32]) -> f64 {
    (x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    dot / (rms(a) * rms(b) * a.len() as f64)
}

/// Row-wise RMSNorm of `x` ([rows][n]) with an optional weight.
fn norm_rows(x: &[f32], n: usize, w: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for (o, r) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
        rms_norm(r, w, eps, o);
    }
    out
}

fn linear(w: &[f32], x: &[f32], rows: usize, n_out: usize, n_in: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * n_out];
    matmul(w, x, rows, n_out, n_in, &mut out);
    out
}

/// Mean over heads and queries (with at least 4 visible keys) of the
/// largest softmax probability: 1.0 would be one-hot attention.
fn mean_max_prob(
    q: &[f32],
    k: &[f32],
    t_len: usize,
    (nq, nkv, hd): (usize, usize, usize),
    window: Option<usize>,
) -> f64 {
    let mut sum = 0.0;
    let mut n = 0;
    for t in 3..t_len {
        for h in 0..nq {
            let qv = &q[(t * nq + h) * hd..(t * nq + h + 1) * hd];
            let kh = h / (nq / nkv);
            let scores: Vec<f64> = (0..=t)
                .filter(|&s| window.is_none_or(|w| t - s < w))
                .map(|s| {
                    let kv = &k[(s * nkv + kh) * hd..(s * nkv + kh + 1) * hd];
                    qv.iter().zip(kv).map(|(&a, &b)| a as f64 * b as f64).sum()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
            sum += 1.0 / z;
            n += 1;
        }
    }
    sum / n as f64
}

#[test]
fn tiny_forward_stays_finite_and_non_degenerate() {
    let f = builtin_tiny().unwrap();
    let cfg = Gemma4Config::from_gguf(&f).unwrap();
    let (d, p, nl, eps) = (cfg.d_model, cfg.ple_dim, cfg.n_layers, cfg.rms_eps);
    let tokens: Vec<usize> = vec![2, 105, 300, 301, 1200, 77, 5, 1999, 640, 640, 812, 1500];
    let t_len = tokens.len();
    let pos: Vec<usize> = (0..t_len).collect();

    let embd = weights(&f, "token_embd.weight");
    let mut h: Vec<f32> = tokens
        .iter()
        .flat_map(|&t| {
            embd[t * d..(t + 1) * d]
                .iter()
                .map(|&v| v * cfg.embed_scale())
        })
        .collect();
    assert!((rms(&h) - 1.0).abs() < 0.3, "embedding rms {}", rms(&h));

    // Per-layer embeddings (spec §3.2).
    let table = weights(&f, "per_layer_token_embd.weight");
    let proj_w = weights(&f, "per_layer_model_proj.weight");
    let proj_norm = weights(&f, "per_layer_proj_norm.weight");
    let mut proj = linear(&proj_w, &h, t_len, nl * p, d);
    proj.iter_mut().for_each(|v| *v /= (d as f32).sqrt());
    let proj = norm_rows(&proj, p, Some(&proj_norm), eps);
    let ple: Vec<f32> = tokens
        .iter()
        .enumerate()
        .flat_map(|(i, &t)| {
            let row = &table[t * nl * p..(t + 1) * nl * p];
            let proj = &proj[i * nl * p..(i + 1) * nl * p];
            row.iter()
                .zip(proj)
                .map(|(&e, &pr)| (e * (p as f32).sqrt() + pr) * std::f32::consts::FRAC_1_SQRT_2)
                .collect::<Vec<_>>()
        })
        .collect();

    let mut caches: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; nl];
    for l in &cfg.layers {
        let i = l.index;
        let (nq, nkv, hd) = (l.n_heads, l.n_kv_heads, l.head_dim);
        let rope = cfg.rope(l.kind);
        let ff = rope.freq_factors.as_deref();
        let a = norm_rows(&h, d, Some(&lw(&f, i, "attn_norm")), eps);
        let mut q = linear(&lw(&f, i, "attn_q"), &a, t_len, nq * hd, d);
        q = norm_rows(&q, hd, Some(&lw(&f, i, "attn_q_norm")), eps);
        for (j, head) in q.chunks_exact_mut(hd).enumerate() {
            rope_neox(head, j / nq, rope.freq_base, rope.dims, ff);
        }
        if l.owns_kv() {
            let k_raw = linear(&lw(&f, i, "attn_k"), &a, t_len, nkv * hd, d);
            let v_raw = if l.k_eq_v {
                k_raw.clone()
            } else {
                linear(&lw(&f, i, "attn_v"), &a, t_len, nkv * hd, d)
            };
            let mut k = norm_rows(&k_raw, hd, Some(&lw(&f, i, "attn_k_norm")), eps);
            for (j, head) in k.chunks_exact_mut(hd).enumerate() {
                rope_neox(head, j / nkv, rope.freq_base, rope.dims, ff);
            }
            caches[i] = Some((k, norm_rows(&v_raw, hd, None, eps)));
        }
        let src = l.kv_donor.unwrap_or(i);
        let (k, v) = caches[src].as_ref().expect("donor cache");
        let window = (l.kind == AttnKind::Sliding).then_some(cfg.sliding_window);
        let pmax = mean_max_prob(&q, k, t_len, (nq, nkv, hd), window);
        assert!(
            pmax < 0.8,
            "layer {i}: attention is near one-hot (mean max prob {pmax})"
        );
        let params = AttnParams {
            n_heads: nq,
            n_kv_heads: nkv,
            head_dim: hd,
            scale: 1.0,
            window,
        };
        let mut o = vec![0f32; t_len * nq * hd];
        attention(&q, &pos, k, v, &pos, &params, &mut o);
        let attn = linear(&lw(&f, i, "attn_output"), &o, t_len, d, nq * hd);
        let attn = norm_rows(&attn, d, Some(&lw(&f, i, "post_attention_norm")), eps);
        h.iter_mut().zip(&attn).for_each(|(x, y)| *x += y);

        let x = norm_rows(&h, d, Some(&lw(&f, i, "ffn_norm")), eps);
        let (gate, up, down) = (
            lw(&f, i, "ffn_gate"),
            lw(&f, i, "ffn_up"),
            lw(&f, i, "ffn_down"),
        );
        let mut fo = vec![0f32; t_len * d];
        for t in 0..t_len {
            gated_ffn(
                &x[t * d..(t + 1) * d],
                &gate,
                &up,
                &down,
                d,
                l.ffn_dim,
                &mut fo[t * d..(t + 1) * d],
            );
        }
        let fo = norm_rows(&fo, d, Some(&lw(&f, i, "post_ffw_norm")), eps);
        h.iter_mut().zip(&fo).for_each(|(x, y)| *x += y);

        let mut g = linear(&lw(&f, i, "inp_gate"), &h, t_len, p, d);
        for t in 0..t_len {
            for c in 0..p {
                let e = &mut g[t * p + c];
                *e = gelu_tanh(*e) * ple[t * nl * p + i * p + c];
            }
        }
        let g = linear(&lw(&f, i, "proj"), &g, t_len, d, p);
        let g = norm_rows(&g, d, Some(&lw(&f, i, "post_norm")), eps);
        h.iter_mut().zip(&g).for_each(|(x, y)| *x += y);
        let scale = lw(&f, i, "layer_output_scale")[0];
        h.iter_mut().for_each(|x| *x *= scale);

        assert!(
            h.iter().all(|x| x.is_finite()),
            "layer {i}: non-finite activations"
        );
        for t in 0..t_len {
            let r = rms(&h[t * d..(t + 1) * d]);
            assert!(
                (0.05..20.0).contains(&r),
                "layer {i} token {t}: residual rms {r}"
            );
        }
        let c = cosine(&h[0..d], &h[(t_len - 1) * d..t_len * d]);
        assert!(
            c.abs() < 0.9,
            "layer {i}: first and last token collapsed (cosine {c})"
        );
    }

    let y = norm_rows(&h, d, Some(&weights(&f, "output_norm.weight")), eps);
    let logits = linear(&embd, &y, t_len, cfg.vocab_size, d);
    let cap = cfg.final_logit_softcap.unwrap();
    let logits: Vec<f32> = logits.iter().map(|&x| softcap(x, cap)).collect();
    assert!(logits.iter().all(|x| x.is_finite()));
    let v = cfg.vocab_size;
    let mut argmax = std::collections::BTreeSet::new();
    for t in 0..t_len {
        let row = &logits[t * v..(t + 1) * v];
        let mean = row.iter().map(|&x| x as f64).sum::<f64>() / v as f64;
        let std = (row.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / v as f64).sqrt();
        assert!((0.3..10.0).contains(&std), "token {t}: logit std {std}");
        let best = (0..v).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
        argmax.insert(best);
    }
    assert!(
        argmax.len() >= 4,
        "next-token predictions collapsed: {argmax:?}"
    );
}
