//! The mixture-of-experts model on the CPU: the `tiny-moe` preset, the MoE
//! block against a plain f64 reference, routing ties, the older separate
//! gate/up expert layout, loader errors for malformed expert tensors, and
//! the CUDA plan of MoE models (and its typed refusal of a routing its
//! expert kernels cannot hold).

use std::sync::OnceLock;

use gemtune_engine::config::{AttnKind, ConfigErrorKind};
use gemtune_engine::cpu::moe::{self, Choice, MoeScratch};
use gemtune_engine::cpu::{CpuEngine, CpuOptions};
use gemtune_engine::forward::LogitRows;
use gemtune_engine::gguf::{GgufFile, GgufValue, GgufWriter};
use gemtune_engine::model::{ExpertMats, LayerWeights, MatRef, Model, ModelError, MoeWeights};
use gemtune_engine::synth::weights::FillError;
use gemtune_engine::synth::{self, SynthModel, SynthOptions, SynthVariant, WeightType};
use gemtune_kernels::quant::{self, GgmlType};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn tiny_moe_file(w: WeightType) -> GgufFile {
    let bytes = synth::synth_to_vec(SynthVariant::TinyMoe, w, SynthOptions::default())
        .expect("synth tiny-moe");
    GgufFile::from_bytes(bytes, "tiny-moe.gguf").expect("parse tiny-moe")
}

fn tiny_moe() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| Model::from_gguf(tiny_moe_file(WeightType::Q8_0)).expect("load tiny-moe"))
}

fn tokens(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t: Vec<u32> = (0..n).map(|_| rng.random_range(3..2048)).collect();
    t[0] = 2;
    t
}

fn moe_of(lw: &LayerWeights) -> &MoeWeights {
    lw.moe.as_ref().expect("a MoE layer")
}

#[test]
fn tiny_moe_has_every_feature_of_26b_a4b() {
    let m = tiny_moe();
    let cfg = m.config();
    let moe = cfg.moe.expect("MoE config");
    assert_eq!(
        (moe.n_experts, moe.n_experts_used, moe.expert_ffn_dim),
        (6, 2, 96)
    );
    assert!(moe.gate_up_fused);
    assert!(!cfg.has_ple() && cfg.n_kv_shared_layers == 0);
    let kinds: Vec<AttnKind> = cfg.layers.iter().map(|l| l.kind).collect();
    assert!(kinds.contains(&AttnKind::Sliding) && kinds.contains(&AttnKind::Full));
    assert!(cfg
        .layers
        .iter()
        .all(|l| l.k_eq_v == (l.kind == AttnKind::Full) && l.ffn_dim == 256));
    for lw in &m.weights().layers {
        let mw = moe_of(lw);
        assert_eq!((mw.router.n_in, mw.router.n_out), (128, 6));
        assert_eq!(mw.router.ty, GgmlType::F32, "the router stays F32");
        assert_eq!(
            (mw.gate.n_in, mw.gate.n_out, mw.gate.n_experts),
            (128, 96, 6)
        );
        assert_eq!((mw.down.n_in, mw.down.n_out), (96, 128));
        assert_eq!(mw.router_scale.len(), 128);
        assert_eq!(mw.expert_scale.len(), 6);
        // Every per-expert scale differs from 1, so applying it is tested.
        assert!(mw.expert_scale.iter().all(|&s| s != 1.0));
        assert_eq!(lw.ffn_gate.n_out, 256, "the dense shared MLP");
        assert!(lw.layer_scale != 1.0);
    }
}

#[test]
fn routing_breaks_ties_to_the_lower_expert_and_renormalises() {
    let mut probs = vec![0.0; 6];
    let mut order = Vec::new();
    let mut out = [Choice {
        expert: 0,
        weight: 0.0,
    }; 2];
    let ones = [1.0f32; 6];
    // All logits equal: experts 0 and 1, half the weight each.
    moe::route(&[0.5; 6], &ones, &mut probs, &mut order, &mut out);
    assert_eq!(out.map(|c| c.expert), [0, 1]);
    assert_eq!(out.map(|c| c.weight), [0.5, 0.5]);
    // A three-way tie for the top: the two lowest of the three.
    moe::route(
        &[0.0, 2.0, 1.0, 2.0, 2.0, -1.0],
        &ones,
        &mut probs,
        &mut order,
        &mut out,
    );
    assert_eq!(out.map(|c| c.expert), [1, 3]);
    // A tie for the second place only.
    moe::route(
        &[0.0, 1.0, 3.0, 1.0, -2.0, 1.0],
        &ones,
        &mut probs,
        &mut order,
        &mut out,
    );
    assert_eq!(out.map(|c| c.expert), [2, 1]);
    let (p2, p1) = (probs[2] as f64, probs[1] as f64);
    assert_eq!(out[0].weight, (p2 / (p1 + p2)) as f32);
    assert_eq!(out[1].weight, (p1 / (p1 + p2)) as f32);
    // The per-expert scale multiplies the renormalised weight.
    let scale = [1.0, 3.0, 0.5, 1.0, 1.0, 1.0];
    moe::route(
        &[0.0, 1.0, 3.0, 1.0, -2.0, 1.0],
        &scale,
        &mut probs,
        &mut order,
        &mut out,
    );
    assert_eq!(out[0].weight, (p2 / (p1 + p2) * 0.5) as f32);
    assert_eq!(out[1].weight, (p1 / (p1 + p2) * 3.0) as f32);
}

/// The CPU engine chooses the experts the `moe_route` kernel's oracle
/// chooses (`kernels::oracle::route_topk`: larger logit first, the lower
/// index among equal logits), on random logits with many exact ties and on
/// logits so close that their f32 probabilities round to the same value.
#[test]
fn routing_agrees_with_the_kernel_oracle() {
    use gemtune_kernels::oracle::route_topk;
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let (e, k) = (128usize, 8usize);
    let ones = vec![1.0f32; e];
    let mut probs = vec![0.0f32; e];
    let mut order = Vec::new();
    let mut out = vec![
        Choice {
            expert: 0,
            weight: 0.0
        };
        k
    ];
    for trial in 0..200 {
        let logits: Vec<f32> = (0..e)
            .map(|_| match trial % 3 {
                // Few distinct values: ties straddle the k-th place.
                0 => rng.random_range(0..4) as f32,
                // Neighbours one ulp apart around 20: equal probabilities.
                1 => f32::from_bits(20.0f32.to_bits() + rng.random_range(0..3)),
                _ => rng.random_range(-4.0f32..4.0),
            })
            .collect();
        moe::route(&logits, &ones, &mut probs, &mut order, &mut out);
        let got: Vec<usize> = out.iter().map(|c| c.expert).collect();
        assert_eq!(got, route_topk(&logits, k), "trial {trial}");
    }
}

/// tiny-moe (Q8_0) with every router written as zeros: every logit is 0,
/// every probability 1/6, a six-way tie on every token and layer.
#[test]
fn a_tie_of_every_expert_routes_every_token_to_experts_0_and_1() {
    let sm = SynthModel::new(
        SynthVariant::TinyMoe,
        WeightType::Q8_0,
        &SynthOptions::default(),
    )
    .unwrap();
    let fill = sm.filler();
    let bytes = GgufWriter::from_file(&tiny_moe_file(WeightType::Q8_0))
        .write_to_vec(|i, info, dst: &mut [u8]| -> Result<(), FillError> {
            if info.name.ends_with("ffn_gate_inp.weight") {
                dst.fill(0);
                Ok(())
            } else {
                fill(i, info, dst)
            }
        })
        .unwrap();
    let model = Model::from_gguf(GgufFile::from_bytes(bytes, "tied.gguf").unwrap()).unwrap();
    let cfg = model.config();
    let moe_cfg = cfg.moe.unwrap();
    let rows = 3;
    let mut x = random_rows(rows, cfg.d_model, 4);
    for lw in &model.weights().layers {
        let mw = moe_of(lw);
        let mut s = MoeScratch::new(cfg, &moe_cfg, rows);
        moe::moe_block(&model, lw, mw, &mut x, rows, &mut s).unwrap();
        for r in 0..rows {
            let want = [
                Choice {
                    expert: 0,
                    weight: 0.5 * mw.expert_scale[0],
                },
                Choice {
                    expert: 1,
                    weight: 0.5 * mw.expert_scale[1],
                },
            ];
            assert_eq!(s.choices(r), want, "row {r}");
        }
    }
    // And the whole forward runs on it.
    let mut e = CpuEngine::new(&model, CpuOptions::default()).unwrap();
    let l = e.forward(&tokens(5, 1), LogitRows::Last).unwrap();
    assert!(l.last().unwrap().iter().all(|v| v.is_finite()));
}

fn random_rows(rows: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..rows * d)
        .map(|_| rng.random_range(-2.0f32..2.0))
        .collect()
}

// ---------------------------------------------------------------------------
// The float64 reference of the MoE block: every step in f64 on the
// dequantized weights, nothing shared with the engine's code.

fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0.0; n];
    quant::dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

fn mat(m: &Model, w: &MatRef) -> Vec<f32> {
    dequant(w.ty, m.mat_bytes(w), w.n_in * w.n_out)
}

fn expert(m: &Model, w: &ExpertMats, e: usize) -> Vec<f32> {
    dequant(w.ty, m.expert_bytes(w, e), w.n_in * w.n_out)
}

fn matvec(w: &[f32], n_in: usize, x: &[f64]) -> Vec<f64> {
    w.chunks_exact(n_in)
        .map(|row| row.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum())
        .collect()
}

fn norm(x: &[f64], w: Option<&[f32]>, eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, v)| v * s * w.map_or(1.0, |w| w[i] as f64))
        .collect()
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

/// `down(gelu(gate x) * up x)`.
fn gated(gate: &[f32], up: &[f32], down: &[f32], d: usize, x: &[f64]) -> Vec<f64> {
    let g = matvec(gate, d, x);
    let u = matvec(up, d, x);
    let h: Vec<f64> = g.iter().zip(&u).map(|(&a, &b)| gelu(a) * b).collect();
    matvec(down, h.len(), &h)
}

/// One row through the MoE block: the new residual row and the chosen
/// experts, highest probability first.
fn reference_block(m: &Model, lw: &LayerWeights, h: &[f32]) -> (Vec<f64>, Vec<usize>) {
    let mw = moe_of(lw);
    let cfg = m.config();
    let (d, eps) = (cfg.d_model, cfg.rms_eps as f64);
    let k = cfg.moe.unwrap().n_experts_used;
    let h: Vec<f64> = h.iter().map(|&v| v as f64).collect();
    // Shared MLP.
    let a1 = norm(&h, Some(&lw.ffn_norm), eps);
    let y = gated(
        &mat(m, &lw.ffn_gate),
        &mat(m, &lw.ffn_up),
        &mat(m, &lw.ffn_down),
        d,
        &a1,
    );
    let f1 = norm(&y, Some(&mw.shared_post_norm), eps);
    // Router on the residual itself.
    let z: Vec<f64> = norm(&h, None, eps)
        .iter()
        .zip(&mw.router_scale)
        .map(|(v, &s)| v * s as f64 / (d as f64).sqrt())
        .collect();
    let logits = matvec(&mat(m, &mw.router), d, &z);
    let max = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
    let probs: Vec<f64> = logits.iter().map(|l| (l - max).exp() / sum).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let top = &order[..k];
    let psum: f64 = top.iter().map(|&e| probs[e]).sum();
    // Experts.
    let a2 = norm(&h, Some(&mw.experts_pre_norm), eps);
    let mut f2 = vec![0.0f64; d];
    for &e in top {
        let w = probs[e] / psum * mw.expert_scale[e] as f64;
        let y = gated(
            &expert(m, &mw.gate, e),
            &expert(m, &mw.up, e),
            &expert(m, &mw.down, e),
            d,
            &a2,
        );
        for (o, v) in f2.iter_mut().zip(y) {
            *o += w * v;
        }
    }
    let f2 = norm(&f2, Some(&mw.experts_post_norm), eps);
    let f: Vec<f64> = f1.iter().zip(&f2).map(|(a, b)| a + b).collect();
    let out = norm(&f, Some(&lw.post_ffw_norm), eps);
    (
        h.iter().zip(out).map(|(a, b)| a + b).collect(),
        top.to_vec(),
    )
}

#[test]
fn moe_block_matches_a_float64_reference_on_every_layer() {
    let m = tiny_moe();
    let cfg = m.config();
    let d = cfg.d_model;
    let rows = 7;
    let mut s = MoeScratch::new(cfg, &cfg.moe.unwrap(), rows);
    let mut routed = std::collections::BTreeSet::new();
    let mut worst = 0f64;
    for (l, lw) in m.weights().layers.iter().enumerate() {
        let h = random_rows(rows, d, 10 + l as u64);
        let mut x = h.clone();
        moe::moe_block(m, lw, moe_of(lw), &mut x, rows, &mut s).unwrap();
        for r in 0..rows {
            let (want, top) = reference_block(m, lw, &h[r * d..(r + 1) * d]);
            let chosen: Vec<usize> = s.choices(r).iter().map(|c| c.expert).collect();
            assert_eq!(chosen, top, "layer {l} row {r}: routing");
            routed.extend(top);
            // The block's update of the residual, engine vs reference.
            let upd_ref: Vec<f64> = (0..d).map(|i| want[i] - h[r * d + i] as f64).collect();
            let scale = upd_ref.iter().fold(0f64, |a, v| a.max(v.abs()));
            let err = (0..d)
                .map(|i| ((x[r * d + i] - h[r * d + i]) as f64 - upd_ref[i]).abs())
                .fold(0f64, f64::max);
            worst = worst.max(err / scale);
            assert!(
                err / scale < 1e-5,
                "layer {l} row {r}: max |diff| / max |update| = {:.2e}",
                err / scale
            );
        }
    }
    eprintln!("MoE block vs f64 reference: max |diff| / max |update| = {worst:.2e}");
    assert!(routed.len() >= 5, "the rows reach most experts: {routed:?}");
}

/// A prefill and single-token decodes give bit-identical logits on the MoE
/// model too (expert grouping never changes a token's result), for every
/// weight type.
#[test]
fn prefill_equals_decodes_for_every_weight_type() {
    let toks = tokens(11, 9);
    for w in WeightType::ALL {
        let model = Model::from_gguf(tiny_moe_file(w)).expect("load tiny-moe");
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
        assert!(a.data.iter().all(|v| v.is_finite()), "{w:?}");
        let same = a
            .data
            .iter()
            .zip(&rows)
            .all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{w:?}: prefill vs decodes differ");
    }
}

// ---------------------------------------------------------------------------
// Files edited before writing.

type Tensors = Vec<(String, Vec<u64>, GgmlType)>;

/// tiny-moe (Q8_0) with its metadata and tensor list edited, every tensor
/// filled by the synth generator (by name, so unedited tensors keep their
/// values).
fn edited(edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Tensors)) -> GgufFile {
    let sm = SynthModel::new(
        SynthVariant::TinyMoe,
        WeightType::Q8_0,
        &SynthOptions::default(),
    )
    .unwrap();
    let mut meta = sm.writer.metadata().to_vec();
    let mut tensors: Tensors = sm
        .writer
        .tensor_infos()
        .iter()
        .map(|t| (t.name.clone(), t.dims.clone(), t.ty))
        .collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        w.add_metadata(k, v);
    }
    for (name, dims, ty) in tensors {
        w.add_tensor(name, dims, ty).unwrap();
    }
    let bytes = w.write_to_vec(sm.filler()).unwrap();
    GgufFile::from_bytes(bytes, "bad-moe.gguf").unwrap()
}

fn config_error(f: GgufFile) -> gemtune_engine::config::ConfigError {
    match Model::from_gguf(f) {
        Err(ModelError::Config(e)) => e,
        Err(e) => panic!("expected a config error, got {e}"),
        Ok(_) => panic!("expected an error"),
    }
}

fn set_key(meta: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
    meta.iter_mut()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no key {key}"))
        .1 = v;
}

#[test]
fn an_expert_stack_of_the_wrong_shape_is_a_typed_error() {
    let e = config_error(edited(|_, t| {
        let g = t
            .iter_mut()
            .find(|(n, _, _)| n == "blk.3.ffn_gate_up_exps.weight")
            .unwrap();
        g.1 = vec![128, 96, 6];
    }));
    assert_eq!(e.item, "tensor 'blk.3.ffn_gate_up_exps.weight'");
    assert_eq!(
        e.kind,
        ConfigErrorKind::TensorShape {
            expected: vec![128, 192, 6],
            found: vec![128, 96, 6]
        }
    );
    let msg = e.to_string();
    assert!(msg.starts_with("bad-moe.gguf: "), "{msg}");
    // A down stack with a wrong expert count.
    let e = config_error(edited(|_, t| {
        t.iter_mut()
            .find(|(n, _, _)| n == "blk.0.ffn_down_exps.weight")
            .unwrap()
            .1 = vec![96, 128, 5];
    }));
    assert!(matches!(e.kind, ConfigErrorKind::TensorShape { .. }), "{e}");
}

#[test]
fn a_missing_expert_scale_is_a_typed_error() {
    let e = config_error(edited(|_, t| {
        t.retain(|(n, _, _)| n != "blk.2.ffn_down_exps.scale");
    }));
    assert_eq!(e.item, "tensor 'blk.2.ffn_down_exps.scale'");
    assert_eq!(e.kind, ConfigErrorKind::MissingTensor);
    let e = config_error(edited(|_, t| {
        t.retain(|(n, _, _)| n != "blk.5.ffn_gate_inp.scale");
    }));
    assert_eq!(e.kind, ConfigErrorKind::MissingTensor);
}

#[test]
fn more_experts_used_than_exist_is_a_typed_error() {
    let e = config_error(edited(|m, _| {
        set_key(m, "gemma4.expert_used_count", GgufValue::U32(7));
    }));
    assert_eq!(e.item, "key 'gemma4.expert_used_count'");
    assert!(matches!(e.kind, ConfigErrorKind::InvalidValue(_)), "{e}");
    assert!(
        e.to_string()
            .contains("7 experts used per token, but the model has 6"),
        "{e}"
    );
    let e = config_error(edited(|m, _| {
        set_key(m, "gemma4.expert_used_count", GgufValue::U32(0));
    }));
    assert!(matches!(e.kind, ConfigErrorKind::InvalidValue(_)), "{e}");
}

#[test]
fn missing_moe_keys_and_stray_expert_tensors_are_typed_errors() {
    let e = config_error(edited(|m, _| {
        m.retain(|(k, _)| k != "gemma4.expert_feed_forward_length");
    }));
    assert_eq!(e.item, "key 'gemma4.expert_feed_forward_length'");
    assert_eq!(e.kind, ConfigErrorKind::MissingKey);
    // Expert tensors in a file that declares no experts.
    let e = config_error(edited(|m, _| {
        set_key(m, "gemma4.expert_count", GgufValue::U32(0));
    }));
    assert!(
        matches!(e.kind, ConfigErrorKind::UnexpectedTensors(ref t) if t.iter().any(|n| n.contains("exps"))),
        "{e}"
    );
}

/// The older layout (separate `ffn_gate_exps` and `ffn_up_exps`) holding
/// the same values as the fused tensor gives bit-identical logits.
#[test]
fn separate_gate_and_up_stacks_load_and_match_the_fused_layout() {
    let fused = tiny_moe_file(WeightType::Q8_0);
    let mut w = GgufWriter::new();
    for (k, v) in GgufWriter::from_file(&fused).metadata() {
        w.add_metadata(k.clone(), v.clone());
    }
    for t in fused.tensors() {
        match t.name.strip_suffix("ffn_gate_up_exps.weight") {
            Some(prefix) => {
                let dims = vec![t.dims[0], t.dims[1] / 2, t.dims[2]];
                w.add_tensor(format!("{prefix}ffn_gate_exps.weight"), dims.clone(), t.ty)
                    .unwrap();
                w.add_tensor(format!("{prefix}ffn_up_exps.weight"), dims, t.ty)
                    .unwrap();
            }
            None => w.add_tensor(t.name.clone(), t.dims.clone(), t.ty).unwrap(),
        }
    }
    let bytes = w
        .write_to_vec(|_, info, dst: &mut [u8]| -> Result<(), String> {
            let (src_name, half) = match info.name.strip_suffix("ffn_gate_exps.weight") {
                Some(p) => (format!("{p}ffn_gate_up_exps.weight"), Some(0)),
                None => match info.name.strip_suffix("ffn_up_exps.weight") {
                    Some(p) => (format!("{p}ffn_gate_up_exps.weight"), Some(1)),
                    None => (info.name.clone(), None),
                },
            };
            let src = fused.tensor(&src_name).ok_or("no source")?;
            let data = fused.tensor_data(src);
            match half {
                None => dst.copy_from_slice(data),
                Some(h) => {
                    // Each expert's block is gate rows then up rows.
                    let n_exp = src.dims[2] as usize;
                    let block = data.len() / n_exp;
                    let part = block / 2;
                    for e in 0..n_exp {
                        let from = e * block + h * part;
                        dst[e * part..(e + 1) * part].copy_from_slice(&data[from..from + part]);
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    let split = Model::from_gguf(GgufFile::from_bytes(bytes, "split.gguf").unwrap()).unwrap();
    assert!(!split.config().moe.unwrap().gate_up_fused);
    let toks = tokens(9, 3);
    let run = |m: &Model| {
        let mut e = CpuEngine::new(m, CpuOptions::default()).unwrap();
        e.forward(&toks, LogitRows::All).unwrap().data
    };
    let (a, b) = (run(tiny_moe()), run(&split));
    assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// The CUDA plan runs the MoE models (every layer plans its expert block)
/// and refuses, with a typed error naming the CPU engine, a routing the
/// expert kernels cannot hold (more than 32 experts per token).
#[test]
fn the_cuda_plan_runs_moe_models_and_refuses_what_its_kernels_cannot_hold() {
    use gemtune_engine::cuda::forward_plan::{ForwardPlan, Sizing};
    use gemtune_engine::cuda::model_dims::ModelDims;
    use gemtune_engine::cuda::{PlanError, Planner};
    use gemtune_engine::profile::Profile;
    use gemtune_kernels::family::{DeviceLimits, KvType};
    let planner = Planner::new(
        Profile::load("main").unwrap(),
        None,
        DeviceLimits::for_arch(gemtune_kernels::compile::Arch(90)),
    );
    let sizing = Sizing {
        max_seq: 256,
        ubatch: 64,
        kv_type: KvType::F16,
    };
    for v in [SynthVariant::TinyMoe, SynthVariant::B26A4b] {
        let cfg = synth::preset(v);
        let dims = ModelDims::of_synth(&cfg, WeightType::Q8_0, &planner);
        let plan = ForwardPlan::resolve(&planner, &cfg, &dims, sizing)
            .unwrap_or_else(|e| panic!("{}: {e}", v.name()));
        for b in &plan.buckets {
            assert!(
                b.layers.iter().all(|l| l.moe.is_some()),
                "{}: bucket {} has a layer without its expert block",
                v.name(),
                b.rows
            );
        }
    }
    let mut wide = synth::preset(SynthVariant::TinyMoe);
    if let Some(m) = wide.moe.as_mut() {
        m.n_experts = 40;
        m.n_experts_used = 33;
    }
    let dims = ModelDims::of_synth(&wide, WeightType::Q8_0, &planner);
    match ForwardPlan::resolve(&planner, &wide, &dims, sizing) {
        Err(e @ PlanError::Unsupported(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("top-33"), "{msg}");
            assert!(msg.contains("--backend cpu"), "{msg}");
        }
        Err(e) => panic!("top-33: expected Unsupported, got {e}"),
        Ok(_) => panic!("top-33 routing was planned"),
    }
}

/// A CPU decode step reads the router and the chosen experts' slices of
/// every expert stack, never the whole stacks.
#[test]
fn a_cpu_step_reads_only_the_chosen_experts() {
    use gemtune_engine::step_bytes::StepReads;
    let m = tiny_moe();
    let w = m.weights();
    let bytes = |t: &MatRef| (t.n_out * t.row_bytes) as u64;
    let slice = |t: &ExpertMats| (t.n_out * t.row_bytes) as u64;
    let mut want = bytes(&w.token_embd);
    let mut chosen = 0;
    for lw in &w.layers {
        let mw = moe_of(lw);
        want += bytes(&lw.attn_q) + bytes(&lw.attn_output);
        want += lw.attn_k.as_ref().map_or(0, bytes) + lw.attn_v.as_ref().map_or(0, bytes);
        want += bytes(&lw.ffn_gate) + bytes(&lw.ffn_up) + bytes(&lw.ffn_down);
        want += bytes(&mw.router);
        chosen += 2 * (slice(&mw.gate) + slice(&mw.up) + slice(&mw.down));
    }
    let reads = StepReads::of_cpu_model(m);
    assert_eq!(reads.matrices, want + chosen);
    // The chosen slices are 2/6 of the expert stacks' bytes.
    let stacks: u64 = m
        .file()
        .tensors()
        .iter()
        .filter(|t| t.name.contains("_exps.weight"))
        .map(|t| t.n_bytes())
        .sum();
    assert_eq!(chosen * 6, stacks * 2);
}
