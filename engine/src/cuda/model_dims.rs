//! The shapes the CUDA forward's launches depend on (`ModelDims`: every
//! projection matrix's rows, columns and device type per layer, the
//! embedding tables, what the upload converts), the device bytes of a
//! model's weights in the layouts a plan reads (`model_bytes`, the fit
//! check before any allocation), and the type the tied head is read as
//! (`head_type`). Computed from a loaded model, a synthetic model's plan
//! or a config, with no GPU.

use std::collections::HashMap;

use gemtune_kernels::bind::matmul::{MatmulBinding, WeightLayout};
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::{Problem, RowsProblem, WType};
use gemtune_kernels::quant::GgmlType;

use super::planner::Planner;
use super::slots::{Proj, Slot, GEMV_MAX_ROWS};
use super::weights::{self, ProjLayouts};
use crate::config::Gemma4Config;
use crate::model::{MatRef, Model};

/// (n, k, device weight type) of one projection matrix.
pub type MatDim = (usize, usize, GgmlType);

/// The shapes the forward's launches depend on.
#[derive(Clone, Debug)]
pub struct ModelDims {
    /// Per layer: qkv, o, gate_up, down, and the PLE gate and projection.
    pub layers: Vec<LayerDims>,
    pub head: MatDim,
    pub ple_model_proj: Option<MatDim>,
    /// Types of the embedding table and the PLE table as the kernels read
    /// them.
    pub embd_type: GgmlType,
    pub ple_type: Option<GgmlType>,
    pub vocab: usize,
    /// Device bytes of the embedding tables (token and PLE) as uploaded.
    pub table_bytes: u64,
    /// The embedding gather reads the tied head's Q6_K plane repack, so
    /// the token table has no device copy of its own
    /// (`embed_on_head_planes`).
    pub embd_on_head: bool,
    /// The file's bytes of every tensor the weights upload reads (the
    /// projection matrices and the embedding tables; norms apart).
    pub file_bytes: u64,
    /// One line per matrix or table converted lossily at load
    /// (`weights::conversion`).
    pub converted: Vec<String>,
    /// One line per matrix or table read in a wider type than the file's,
    /// every value kept (`weights::widening`: Q4_0 / Q5_0 as Q8_0).
    pub widened: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct LayerDims {
    /// The Q|K|V runs (`weights::fused_runs`): one unless the parts' types
    /// differ.
    pub qkv: Vec<MatDim>,
    pub o: MatDim,
    pub gate_up: MatDim,
    pub down: MatDim,
    pub ple: Option<(MatDim, MatDim)>,
    /// The mixture-of-experts block of a 26B-A4B layer (beside the dense
    /// shared MLP above).
    pub moe: Option<MoeDims>,
}

/// The expert tensors and router of a MoE layer, each stack as one matrix
/// of `n_experts` blocks of rows (`bind::moe::expert_binding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeDims {
    /// Gate and up of every expert: `E * 2 * ffn` rows of `d_model`
    /// (expert `e`'s gate rows, then its up rows), in the device type.
    pub gate_up: MatDim,
    /// `E * d_model` rows of `ffn`, in the device type.
    pub down: MatDim,
    /// The router, `E` rows of `d_model`, as the file stores it (the
    /// `moe_route` kernel reads F32, F16, BF16, Q8_0 and Q4_0 blocks).
    pub router: MatDim,
    pub n_experts: usize,
    pub n_used: usize,
    pub ffn: usize,
}

/// Builds the shapes from tensor names, their file types and `[n][k]`
/// shapes, recording the file's bytes and every conversion.
struct DimsBuilder<'a> {
    ty: &'a dyn Fn(&str) -> GgmlType,
    file_bytes: u64,
    converted: Vec<String>,
    widened: Vec<String>,
}

impl DimsBuilder<'_> {
    /// One projection fused from `parts` (name, rows), all of width `k`.
    fn matrix(&mut self, fused: &str, parts: &[(String, usize)], k: usize) -> MatDim {
        let types: Vec<GgmlType> = parts.iter().map(|(n, _)| (self.ty)(n)).collect();
        for ((_, rows), &t) in parts.iter().zip(&types) {
            self.file_bytes += weights::gguf_bytes(t, *rows, k);
        }
        let wt = weights::device_type(&types);
        if let Some(c) = weights::conversion(&types, wt) {
            self.converted.push(format!("{fused} {c}"));
        }
        if let Some(w) = weights::widening(&types, wt.ggml()) {
            self.widened.push(format!("{fused} {w}"));
        }
        (parts.iter().map(|p| p.1).sum(), k, wt.ggml())
    }
    /// The MoE block of layer `i`: the expert stacks (gate and up fused,
    /// whether the file holds `ffn_gate_up_exps` or the two halves) and
    /// the router.
    fn moe(&mut self, cfg: &Gemma4Config, i: usize, m: &crate::config::MoeConfig) -> MoeDims {
        let name = |s: &str| crate::plan::layer_tensor_name(i, s);
        let (d, e, fe) = (cfg.d_model, m.n_experts, m.expert_ffn_dim);
        let gu_parts: Vec<(String, usize)> = if m.gate_up_fused {
            vec![(name("ffn_gate_up_exps"), 2 * fe * e)]
        } else {
            vec![
                (name("ffn_gate_exps"), fe * e),
                (name("ffn_up_exps"), fe * e),
            ]
        };
        let gate_up = self.matrix(&format!("blk.{i}.ffn_gate_up_exps"), &gu_parts, d);
        let dn = name("ffn_down_exps");
        let down = self.matrix(&dn, &[(dn.clone(), d * e)], fe);
        let rn = name("ffn_gate_inp");
        let rt = (self.ty)(&rn);
        self.file_bytes += weights::gguf_bytes(rt, e, d);
        let router = weights::router_type(rt);
        if let Some(w) = weights::widening(&[rt], router) {
            self.widened.push(format!("{rn} {w}"));
        } else if router != rt {
            self.converted.push(format!(
                "{rn} ({}) -> {} router, lossy: moe_route reads {}",
                rt.name(),
                router.name(),
                weights::ROUTER_TYPES
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        MoeDims {
            gate_up,
            down,
            router: (e, d, router),
            n_experts: e,
            n_used: m.n_experts_used,
            ffn: fe,
        }
    }

    /// An embedding table `[rows][k]`: its device type and bytes.
    fn table(&mut self, name: &str, rows: usize, k: usize) -> (GgmlType, u64) {
        let t = (self.ty)(name);
        self.file_bytes += weights::gguf_bytes(t, rows, k);
        let dev = weights::table_type(t);
        if let Some(w) = weights::widening(&[t], dev) {
            self.widened.push(format!("{name} {w}"));
        } else if dev != t {
            self.converted.push(format!(
                "{name} ({}) -> {} table, lossy: the embed kernels read {}",
                t.name(),
                dev.name(),
                weights::EMBED_TYPES
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        (dev, weights::gguf_bytes(dev, rows, k))
    }
}

impl ModelDims {
    /// Shapes of a model whose projection matrices are stored as `matrix`
    /// and whose embedding tables as `embd` (the uniform synthetic files),
    /// after the engine's load-time conversions under `planner`'s profile.
    pub fn from_config(
        cfg: &Gemma4Config,
        matrix: GgmlType,
        embd: GgmlType,
        planner: &Planner,
    ) -> ModelDims {
        let ty = |name: &str| {
            if name.ends_with("token_embd.weight") {
                embd
            } else {
                matrix
            }
        };
        ModelDims::of_tensors(cfg, &ty, planner)
    }

    /// Shapes of the synthetic file `w` of `cfg` (`synth::mix`: the k-quant
    /// mixes put Q6_K on some attn_v and ffn_down tensors).
    pub fn of_synth(
        cfg: &Gemma4Config,
        w: crate::synth::WeightType,
        planner: &Planner,
    ) -> ModelDims {
        let plan = crate::plan::tensor_plan(cfg);
        let types = crate::synth::mix::tensor_types(&plan, cfg.n_layers, w);
        let by_name: HashMap<String, GgmlType> =
            plan.into_iter().map(|s| s.name).zip(types).collect();
        let ty = |name: &str| by_name.get(name).copied().unwrap_or(GgmlType::F32);
        ModelDims::of_tensors(cfg, &ty, planner)
    }

    /// Shapes of a loaded model's tensors, as the engine will upload them.
    pub fn of_model(model: &Model, planner: &Planner) -> ModelDims {
        let w = model.weights();
        let mut mats: Vec<&MatRef> = vec![&w.token_embd];
        if let Some(p) = &w.ple {
            mats.extend([&p.token_embd, &p.model_proj]);
        }
        for lw in &w.layers {
            mats.extend(weights::qkv_parts(lw));
            mats.extend([&lw.attn_output, &lw.ffn_gate, &lw.ffn_up, &lw.ffn_down]);
            if let Some(p) = &lw.ple {
                mats.extend([&p.inp_gate, &p.proj]);
            }
        }
        let mut by_name: HashMap<&str, GgmlType> =
            mats.iter().map(|m| (m.name.as_str(), m.ty)).collect();
        for mw in w.layers.iter().filter_map(|l| l.moe.as_ref()) {
            by_name.insert(mw.router.name.as_str(), mw.router.ty);
            for e in [&mw.gate, &mw.up, &mw.down] {
                by_name.insert(e.name.as_str(), e.ty);
            }
        }
        let ty = |name: &str| by_name.get(name).copied().unwrap_or(GgmlType::F32);
        ModelDims::of_tensors(model.config(), &ty, planner)
    }

    /// Shapes of a model of `cfg` whose tensor `name` has file type
    /// `ty(name)` (GGUF names, `plan::tensor_plan`).
    pub fn of_tensors(
        cfg: &Gemma4Config,
        ty: &dyn Fn(&str) -> GgmlType,
        planner: &Planner,
    ) -> ModelDims {
        let d = cfg.d_model;
        let p = cfg.ple_dim;
        let mut b = DimsBuilder {
            ty,
            file_bytes: 0,
            converted: Vec::new(),
            widened: Vec::new(),
        };
        let name = |l: usize, s: &str| crate::plan::layer_tensor_name(l, s);
        let layers = cfg
            .layers
            .iter()
            .map(|l| {
                let i = l.index;
                let mut qkv = vec![(name(i, "attn_q"), l.q_dim())];
                if l.owns_kv() {
                    qkv.push((name(i, "attn_k"), l.kv_dim()));
                    if !l.k_eq_v {
                        qkv.push((name(i, "attn_v"), l.kv_dim()));
                    }
                }
                let types: Vec<GgmlType> = qkv.iter().map(|(n, _)| ty(n)).collect();
                let runs = weights::fused_runs(&types);
                LayerDims {
                    qkv: runs
                        .iter()
                        .enumerate()
                        .map(|(j, r)| {
                            b.matrix(&weights::qkv_run_name(i, j, runs.len()), &qkv[r.clone()], d)
                        })
                        .collect(),
                    o: b.matrix(
                        &name(i, "attn_output"),
                        &[(name(i, "attn_output"), d)],
                        l.q_dim(),
                    ),
                    gate_up: b.matrix(
                        &format!("blk.{i}.ffn_gate_up"),
                        &[
                            (name(i, "ffn_gate"), l.ffn_dim),
                            (name(i, "ffn_up"), l.ffn_dim),
                        ],
                        d,
                    ),
                    down: b.matrix(&name(i, "ffn_down"), &[(name(i, "ffn_down"), d)], l.ffn_dim),
                    ple: (p > 0).then(|| {
                        (
                            b.matrix(&name(i, "inp_gate"), &[(name(i, "inp_gate"), p)], d),
                            b.matrix(&name(i, "proj"), &[(name(i, "proj"), d)], p),
                        )
                    }),
                    moe: cfg.moe.as_ref().map(|m| b.moe(cfg, i, m)),
                }
            })
            .collect();
        let (embd_type, mut table_bytes) = b.table("token_embd.weight", cfg.vocab_size, d);
        let embd_file = ty("token_embd.weight");
        let head_t = head_type(planner, embd_file, cfg.vocab_size, d);
        if let Some(w) = weights::widening(&[embd_file], head_t) {
            b.widened.push(format!("token_embd (head) {w}"));
        } else if embd_file != head_t && planner.profile.head_convert == Some(head_t) {
            b.converted.push(format!(
                "token_embd (head) ({}) -> {} planes, lossy: profile {} asks for it (head_convert)",
                embd_file.name(),
                head_t.name(),
                planner.profile.name
            ));
        } else if let Some(c) =
            weights::conversion(&[embd_file], WType::of(head_t).unwrap_or(WType::Q8_0))
        {
            b.converted.push(format!("token_embd (head) {c}"));
        }
        let embd_on_head = embed_on_head_planes(planner, embd_file, head_t, cfg.vocab_size, d);
        if embd_on_head {
            table_bytes -= weights::gguf_bytes(embd_type, cfg.vocab_size, d);
        }
        let (ple_model_proj, ple_type) = if p > 0 {
            let row = cfg.n_layers * p;
            let mp = "per_layer_model_proj.weight".to_string();
            let proj = b.matrix(&mp, &[(mp.clone(), row)], d);
            let (t, bytes) = b.table("per_layer_token_embd.weight", cfg.vocab_size, row);
            table_bytes += bytes;
            (Some(proj), Some(t))
        } else {
            (None, None)
        };
        ModelDims {
            layers,
            head: (cfg.vocab_size, d, head_t),
            ple_model_proj,
            embd_type,
            ple_type,
            vocab: cfg.vocab_size,
            table_bytes,
            embd_on_head,
            file_bytes: b.file_bytes,
            converted: b.converted,
            widened: b.widened,
        }
    }
}

/// Device bytes of a model's weights in `lay`, from its shapes and device
/// types (the fit check before any allocation; `upload` allocates exactly
/// these): every projection in its layouts, the embedding tables as the
/// kernels read them, and the tied head unless it shares the table.
pub fn model_bytes(dims: &ModelDims, lay: &ProjLayouts) -> u64 {
    let mat = |m: &MatDim, p: Proj| {
        let wt = WType::of(m.2).unwrap_or(WType::Q8_0);
        weights::planned_bytes(wt, m.0, m.1, lay.get(p))
    };
    let mut b = 0u64;
    for l in &dims.layers {
        b += l.qkv.iter().map(|m| mat(m, Proj::Qkv)).sum::<u64>() + mat(&l.o, Proj::O);
        b += mat(&l.gate_up, Proj::GateUp) + mat(&l.down, Proj::Down);
        if let Some((g, p)) = &l.ple {
            b += mat(g, Proj::Ple) + mat(p, Proj::Ple);
        }
        if let Some(m) = &l.moe {
            let stack = |s: &MatDim, lay: weights::Layouts| {
                let wt = WType::of(s.2).unwrap_or(WType::Q8_0);
                weights::planned_bytes(wt, s.0, s.1, lay)
            };
            b += stack(&m.gate_up, lay.experts_gate_up) + stack(&m.down, lay.experts_down);
            b += weights::gguf_bytes(m.router.2, m.router.0, m.router.1);
        }
    }
    b += dims.table_bytes;
    if !lay.head_native {
        b += mat(&dims.head, Proj::Head);
    }
    if let Some(mp) = &dims.ple_model_proj {
        b += mat(mp, Proj::Ple);
    }
    b
}

/// Whether the embedding gather reads the tied head's own Q6_K plane
/// repack (its nibble plane and GEMV side records, `embed` with
/// `LAYOUT=1`) instead of a GGUF copy of the table: the table is Q6_K in
/// the file, the head is read as Q6_K planes with f16-side records at
/// every row count it runs (`gemv.head`), and the embed slot serves a
/// Q6_K table with `LAYOUT=1`. One lossless copy then serves both, at the
/// plane repack's bytes (216 per 210 of the table's).
pub fn embed_on_head_planes(
    planner: &Planner,
    embd: GgmlType,
    head: GgmlType,
    n: usize,
    k: usize,
) -> bool {
    let slot = Slot::Gemv(Proj::Head);
    if embd != GgmlType::Q6K || head != GgmlType::Q6K || planner.vendor(slot) {
        return false;
    }
    let planes = (1..=GEMV_MAX_ROWS).all(|m| {
        planner
            .resolve(slot, &Problem::matmul(m, n, k, GgmlType::Q6K), &[])
            .ok()
            .and_then(|r| MatmulBinding::of(r.family.name(), &r.defines).ok())
            .is_some_and(|b| b.layout == weights::PLANES_F16)
    });
    let gather = Problem::Rows(RowsProblem {
        rows: 1,
        width: k,
        dtype: GgmlType::Q6K,
        aux: 0,
    });
    let layout1 = [("LAYOUT", DefineValue::Int(1))];
    planes
        && planner
            .resolve(Slot::Embed, &gather, &layout1)
            .is_ok_and(|r| r.defines.get("LAYOUT") == Some(&DefineValue::Int(1)))
}

/// The weight type the tied head (`token_embd`, `n` x `k`, stored as
/// `embd`) is read as: Q6_K as it is in the file when `gemv.head` resolves,
/// at every row count the head runs (1..=GEMV_MAX_ROWS), to a variant that
/// reads Q6_K GGUF blocks; else, for a Q6_K table, the profile's
/// `head_convert` type when it asks for one (main: Q8_0 planes, measured
/// faster end to end than the Q6_K plane repack); otherwise the load-time
/// device type (`weights::device_type`: the file's type when a matmul
/// kernel reads it).
pub fn head_type(planner: &Planner, embd: GgmlType, n: usize, k: usize) -> GgmlType {
    let converted = weights::device_type(&[embd]).ggml();
    let slot = Slot::Gemv(Proj::Head);
    if embd != GgmlType::Q6K || planner.vendor(slot) {
        return converted;
    }
    let native = (1..=GEMV_MAX_ROWS).all(|m| {
        planner
            .resolve(slot, &Problem::matmul(m, n, k, GgmlType::Q6K), &[])
            .ok()
            .and_then(|r| MatmulBinding::of(r.family.name(), &r.defines).ok())
            .is_some_and(|b| b.layout == WeightLayout::GgufBlocks)
    });
    match (native, planner.profile.head_convert) {
        (true, _) => GgmlType::Q6K,
        (false, Some(t)) => t,
        (false, None) => converted,
    }
}
