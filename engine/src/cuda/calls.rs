//! Every (slot, problem, bound defines) the CUDA forward launches at a given
//! row count, computed from the model's shapes alone.
//!
//! The engine plans (compiles and loads) exactly this list at load, so no
//! kernel compiles afterwards; a CPU test resolves the same list for every
//! committed profile on sm_80, sm_89 and sm_90 and compiles the result, so a
//! profile or tuned entry that names something a device cannot run fails in
//! CI, not on a GPU.

use gemtune_kernels::bind::matmul::{MatmulBinding, WeightLayout};
use gemtune_kernels::bind::ActFormat;
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::{AttnProblem, KvType, Problem, RowsProblem};
use gemtune_kernels::quant::GgmlType;

use super::forward::{slot_for, GEMV_MAX_ROWS};
use super::plan::{PlanError, Planner};
use crate::config::{AttnKind, Gemma4Config, LayerConfig};

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
}

#[derive(Clone, Debug)]
pub struct LayerDims {
    pub qkv: MatDim,
    pub o: MatDim,
    pub gate_up: MatDim,
    pub down: MatDim,
    pub ple: Option<(MatDim, MatDim)>,
}

impl ModelDims {
    /// Shapes of a model whose projection matrices are stored as `matrix`
    /// and whose embedding tables as `embd` (the synthetic files' layout),
    /// after the engine's load-time conversions under `planner`'s profile
    /// (which decides whether the tied head reads Q6_K as it is).
    pub fn from_config(
        cfg: &Gemma4Config,
        matrix: GgmlType,
        embd: GgmlType,
        planner: &Planner,
    ) -> ModelDims {
        let dev = super::weights::device_type(matrix).ggml();
        let d = cfg.d_model;
        let p = cfg.ple_dim;
        let layers = cfg
            .layers
            .iter()
            .map(|l| {
                let kv = if l.owns_kv() {
                    if l.k_eq_v {
                        l.kv_dim()
                    } else {
                        2 * l.kv_dim()
                    }
                } else {
                    0
                };
                LayerDims {
                    qkv: (l.q_dim() + kv, d, dev),
                    o: (d, l.q_dim(), dev),
                    gate_up: (2 * l.ffn_dim, d, dev),
                    down: (d, l.ffn_dim, dev),
                    ple: (p > 0).then_some(((p, d, dev), (d, p, dev))),
                }
            })
            .collect();
        let readable = |t: GgmlType| {
            if super::launch::EMBED_TYPES.contains(&t) {
                t
            } else {
                GgmlType::Q8_0
            }
        };
        ModelDims {
            layers,
            head: (
                cfg.vocab_size,
                d,
                head_type(planner, embd, cfg.vocab_size, d),
            ),
            ple_model_proj: (p > 0).then_some((cfg.n_layers * p, d, dev)),
            embd_type: readable(embd),
            ple_type: (p > 0).then_some(readable(embd)),
            vocab: cfg.vocab_size,
        }
    }
}

/// The weight type the tied head (`token_embd`, `n` x `k`, stored as
/// `embd`) is read as: Q6_K as it is in the file when `gemv.head` resolves,
/// at every row count the head runs (1..=GEMV_MAX_ROWS), to a variant that
/// reads Q6_K GGUF blocks; otherwise the load-time device type (Q8_0 or
/// Q4_0), converted.
pub fn head_type(planner: &Planner, embd: GgmlType, n: usize, k: usize) -> GgmlType {
    let converted = super::weights::device_type(embd).ggml();
    if embd != GgmlType::Q6K || planner.vendor("gemv.head") {
        return converted;
    }
    let native = (1..=GEMV_MAX_ROWS).all(|m| {
        planner
            .resolve("gemv.head", &Problem::matmul(m, n, k, GgmlType::Q6K), &[])
            .ok()
            .and_then(|(f, d, _)| MatmulBinding::of(f.name(), &d).ok())
            .is_some_and(|b| b.layout == WeightLayout::GgufBlocks)
    });
    if native {
        GgmlType::Q6K
    } else {
        converted
    }
}

/// One launch site's plan request.
#[derive(Clone, Debug)]
pub struct SlotCall {
    pub slot: String,
    pub problem: Problem,
    pub bound: Vec<(&'static str, DefineValue)>,
}

/// The K/V capacity of layer `l`'s cache (its donor's on shared layers).
pub fn kv_capacity(cfg: &Gemma4Config, l: &LayerConfig, max_seq: usize, ubatch: usize) -> usize {
    let src = &cfg.layers[l.kv_donor.unwrap_or(l.index)];
    match src.kind {
        AttnKind::Full => max_seq,
        AttnKind::Sliding => (cfg.sliding_window + ubatch - 1).min(max_seq),
    }
}

pub fn window(cfg: &Gemma4Config, l: &LayerConfig) -> usize {
    match l.kind {
        AttnKind::Sliding => cfg.sliding_window,
        AttnKind::Full => 0,
    }
}

/// The attention problem a launch of `n_q` queries on layer `l` is planned
/// for: only launch-shaping dimensions. Decode (at most 8 queries) is
/// planned at the largest length the cache reaches, so its fixed grid
/// covers every later call (the kernel reads the true length on device);
/// prefill at position 0, its grid depending on the query count only.
pub fn attn_problem(
    cfg: &Gemma4Config,
    l: &LayerConfig,
    n_q: usize,
    max_seq: usize,
    ubatch: usize,
    kv_type: KvType,
) -> AttnProblem {
    let cap = kv_capacity(cfg, l, max_seq, ubatch);
    let decode = n_q <= GEMV_MAX_ROWS;
    AttnProblem {
        n_heads: l.n_heads,
        n_kv_heads: l.n_kv_heads,
        head_dim: l.head_dim,
        window: window(cfg, l),
        q_pos0: if decode {
            max_seq.saturating_sub(n_q)
        } else {
            0
        },
        n_q,
        capacity: if decode { cap } else { cap.max(n_q) },
        kv_type,
    }
}

pub fn attn_slot(l: &LayerConfig, n_q: usize) -> &'static str {
    match (n_q <= GEMV_MAX_ROWS, l.kind) {
        (true, AttnKind::Sliding) => "attn_decode.swa",
        (true, AttnKind::Full) => "attn_decode.full",
        (false, AttnKind::Sliding) => "attn_prefill.swa",
        (false, AttnKind::Full) => "attn_prefill.full",
    }
}

pub fn rows_problem(rows: usize, width: usize) -> Problem {
    Problem::Rows(RowsProblem {
        rows,
        width,
        dtype: GgmlType::F32,
        aux: 0,
    })
}

/// The bound defines of an `rmsnorm` launch.
pub fn norm_bound(out: ActFormat, add: bool, norm_out: bool) -> Vec<(&'static str, DefineValue)> {
    vec![
        ("OUT", DefineValue::Str(out.define().into())),
        ("ADD", DefineValue::Int(add as i64)),
        ("NORM_OUT", DefineValue::Int(norm_out as i64)),
    ]
}

pub fn out_bound(out: ActFormat) -> Vec<(&'static str, DefineValue)> {
    vec![("OUT", DefineValue::Str(out.define().into()))]
}

/// The bound defines of a `qk_norm_rope` launch: Q in the cache type for
/// an attention kernel that reads it so (`AttnIo::q16`).
pub fn q16_bound(q16: bool) -> Vec<(&'static str, DefineValue)> {
    vec![("Q16", DefineValue::Int(q16 as i64))]
}

/// How one attention call's Q and O travel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnIo {
    /// The planned attention variant reads Q in the cache type (Q16 = 1),
    /// so `qk_norm_rope` writes it so.
    pub q16: bool,
    /// The format the attention writes O in: the output projection's
    /// activation format when the variant can write it (the wgmma prefill
    /// loop writes DQ_F16 / DQ_BF16), so no conversion pass runs between
    /// them; otherwise f32.
    pub out: ActFormat,
}

/// The attention slot's I/O at `p`, given the format `o_fmt` the output
/// projection reads: from the variant the slot resolves to (its fallback
/// included), bound to `o_fmt` only where that variant validates with it.
/// Decided once per (slot, problem, format) and kept by the planner.
pub fn attn_io(
    planner: &Planner,
    slot: &str,
    p: &Problem,
    o_fmt: ActFormat,
) -> Result<AttnIo, PlanError> {
    let key = format!("{slot}|{}|{}", p.describe(), o_fmt.define());
    planner.attn_io_memo(key, || {
        let (fam, mut d, _) = planner.resolve(slot, p, &[])?;
        let q16 = d.get("Q16") == Some(&DefineValue::Int(1));
        d.insert("OUT".into(), DefineValue::Str(o_fmt.define().into()));
        let writes = o_fmt != ActFormat::F32
            && fam.declared_defines().iter().any(|x| x == "OUT")
            && fam.validate(&d, p, &planner.limits).is_ok();
        let out = if writes { o_fmt } else { ActFormat::F32 };
        Ok(AttnIo { q16, out })
    })
}

/// The activation format the slot serving projection `kind` at `m` rows
/// reads (f32 for the vendor arm, which converts its operand itself).
pub fn consumer_format(
    planner: &Planner,
    kind: &str,
    dim: MatDim,
    m: usize,
) -> Result<ActFormat, PlanError> {
    let slot = slot_for(kind, m);
    if planner.vendor(&slot) {
        return Ok(ActFormat::F32);
    }
    let p = Problem::matmul(planner.plan_rows(&slot, m), dim.0, dim.1, dim.2);
    let (fam, d, _) = planner.resolve(&slot, &p, &[])?;
    MatmulBinding::of(fam.name(), &d)
        .map(|b| b.act)
        .map_err(|msg| PlanError::Slot { slot, msg })
}

/// The list being built, deduplicated.
struct Calls<'a> {
    planner: &'a Planner,
    out: Vec<SlotCall>,
}

impl Calls<'_> {
    fn push(&mut self, slot: &str, problem: Problem, bound: Vec<(&'static str, DefineValue)>) {
        let c = SlotCall {
            slot: slot.to_string(),
            problem,
            bound,
        };
        if !self
            .out
            .iter()
            .any(|o| o.slot == c.slot && o.problem == c.problem && o.bound == c.bound)
        {
            self.out.push(c);
        }
    }

    /// A projection at `m` rows and its activation pre-pass; returns the
    /// format its input must be in.
    fn matmul(&mut self, kind: &str, dim: MatDim, m: usize) -> Result<ActFormat, PlanError> {
        let slot = slot_for(kind, m);
        let fmt = consumer_format(self.planner, kind, dim, m)?;
        if self.planner.vendor(&slot) {
            self.push("act_convert", rows_problem(m, dim.1), vec![]);
        } else if self.planner.row_chunked(&slot) {
            let blk = super::plan::GEMV_BLOCK;
            self.push(
                &slot,
                Problem::matmul(m.min(blk), dim.0, dim.1, dim.2),
                vec![],
            );
            if m > blk && m % blk != 0 {
                self.push(&slot, Problem::matmul(m % blk, dim.0, dim.1, dim.2), vec![]);
            }
        } else {
            self.push(&slot, Problem::matmul(m, dim.0, dim.1, dim.2), vec![]);
        }
        if fmt == ActFormat::Q8_1 {
            self.push(
                "quantize_q8_1",
                Problem::matmul(m, 1, dim.1, GgmlType::Q8_0),
                vec![],
            );
        }
        Ok(fmt)
    }
}

/// Every launch the forward makes at `r` rows, deduplicated.
pub fn slot_calls(
    planner: &Planner,
    cfg: &Gemma4Config,
    dims: &ModelDims,
    r: usize,
    max_seq: usize,
    ubatch: usize,
    kv_type: KvType,
) -> Result<Vec<SlotCall>, PlanError> {
    let mut c = Calls {
        planner,
        out: Vec::new(),
    };
    let d = cfg.d_model;
    let p = cfg.ple_dim;
    for (l, lc) in cfg.layers.iter().enumerate() {
        let ld = &dims.layers[l];
        let attn = Problem::Attention(attn_problem(cfg, lc, r, max_seq, ubatch, kv_type));
        let f_qkv = c.matmul("qkv", ld.qkv, r)?;
        let f_o = c.matmul("o", ld.o, r)?;
        let io = attn_io(planner, attn_slot(lc, r), &attn, f_o)?;
        c.push(attn_slot(lc, r), attn, out_bound(io.out));
        c.push("qk_norm_rope", attn, q16_bound(io.q16));
        let f_gu = c.matmul("gate_up", ld.gate_up, r)?;
        let f_down = c.matmul("down", ld.down, r)?;
        c.push(
            "rmsnorm",
            rows_problem(r, d),
            norm_bound(f_qkv, false, true),
        );
        c.push("rmsnorm", rows_problem(r, d), norm_bound(f_gu, true, true));
        c.push("rmsnorm", rows_problem(r, d), norm_bound(f_qkv, true, true));
        c.push(
            "rmsnorm",
            rows_problem(r, d),
            norm_bound(ActFormat::F32, true, false),
        );
        c.push(
            "gelu_mul",
            rows_problem(r, ld.gate_up.0 / 2),
            out_bound(f_down),
        );
        if let Some((g, pr)) = ld.ple {
            c.matmul("ple", g, r)?;
            let f_pr = c.matmul("ple", pr, r)?;
            c.push("gelu_mul", rows_problem(r, p), out_bound(f_pr));
        }
    }
    if r <= GEMV_MAX_ROWS {
        let f = c.matmul("head", dims.head, r)?;
        c.push("softcap", rows_problem(r, dims.vocab), vec![]);
        c.push("rmsnorm", rows_problem(r, d), norm_bound(f, false, true));
    }
    c.push(
        "embed",
        Problem::Rows(RowsProblem {
            rows: r,
            width: d,
            dtype: dims.embd_type,
            aux: 0,
        }),
        vec![],
    );
    if let (Some(mp), Some(t)) = (dims.ple_model_proj, dims.ple_type) {
        c.matmul("ple", mp, r)?;
        c.push(
            "ple",
            Problem::Rows(RowsProblem {
                rows: r,
                width: cfg.n_layers * p,
                dtype: t,
                aux: p,
            }),
            vec![],
        );
    }
    Ok(c.out)
}
