//! Problem shapes the kernel families run on (matmul, attention, row-wise),
//! the weight types of the matmul families, and the checks every family's
//! `validate` shares.

use crate::defines::{get_str, DefineValue, Defines};
use crate::quant::GgmlType;
use serde::{Deserialize, Serialize};

/// out[m][n] = sum_k x[m][k] * W[n][k]: `m` tokens, `n` output features,
/// `k` input features, W stored as `wtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulProblem {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: GgmlType,
}

/// Element type of a K/V cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum KvType {
    F16,
    Bf16,
    F32,
}

impl KvType {
    pub fn bytes(self) -> usize {
        match self {
            KvType::F16 | KvType::Bf16 => 2,
            KvType::F32 => 4,
        }
    }
    /// The name used in shapes files, CSV columns and the `KV_TYPE` define.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "F16",
            KvType::Bf16 => "BF16",
            KvType::F32 => "F32",
        }
    }
    pub fn from_name(s: &str) -> Option<KvType> {
        match s.to_ascii_uppercase().as_str() {
            "F16" => Some(KvType::F16),
            "BF16" => Some(KvType::Bf16),
            "F32" => Some(KvType::F32),
            _ => None,
        }
    }
}

/// One attention call of a Gemma 4 layer over its KV cache.
///
/// Queries are the `n_q` tokens at positions `q_pos0 .. q_pos0 + n_q`; they
/// attend to keys `0 .. q_pos0 + n_q` (causal, `k <= q`), and with a window
/// `W > 0` only to keys with `q - k < W`. Scale 1.0 (Gemma 4 has none).
///
/// Layouts (the engine's, which the kernels read as they are):
/// - `q`, `out`: f32 `[n_q][n_heads][head_dim]`;
/// - K and V caches: `kv_type` `[capacity][n_kv_heads][head_dim]`, the key of
///   position `p` in slot `p % capacity`. A linear cache has
///   `capacity >= q_pos0 + n_q`; a sliding layer's ring buffer has at least
///   `window + n_q - 1` slots (every key a query of the call can see);
///   `capacity < q_pos0 + n_q` means the ring has wrapped.
/// - Query head `h` reads KV head `h / (n_heads / n_kv_heads)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttnProblem {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window W; 0 = full causal attention.
    pub window: usize,
    pub q_pos0: usize,
    pub n_q: usize,
    pub capacity: usize,
    pub kv_type: KvType,
}

impl AttnProblem {
    /// Keys the cache holds after the call (`q_pos0 + n_q`).
    pub fn kv_len(&self) -> usize {
        self.q_pos0 + self.n_q
    }
    pub fn group(&self) -> usize {
        self.n_heads / self.n_kv_heads.max(1)
    }
    /// Whether the ring buffer wrapped (some slot was written twice).
    pub fn wrapped(&self) -> bool {
        self.capacity < self.kv_len()
    }
    /// (query, key) pairs the masks admit, per query head: the work an
    /// attention kernel must do at least (the causal triangle or the window
    /// band), for TFLOP/s that count no masked work.
    pub fn visible_pairs(&self) -> u64 {
        (self.q_pos0..self.q_pos0 + self.n_q)
            .map(|q| {
                let lo = if self.window > 0 {
                    (q + 1).saturating_sub(self.window)
                } else {
                    0
                };
                (q + 1 - lo) as u64
            })
            .sum()
    }
    /// The shape's rejection reason, if it cannot be a Gemma 4 attention call.
    pub fn check(&self) -> Result<(), String> {
        if self.n_heads == 0 || self.n_kv_heads == 0 || self.n_heads % self.n_kv_heads != 0 {
            return Err(format!(
                "{} query heads over {} KV heads: the KV heads must divide the query heads",
                self.n_heads, self.n_kv_heads
            ));
        }
        if self.n_q == 0 || self.head_dim == 0 {
            return Err("n_q and head_dim must be positive".into());
        }
        let need = if self.window > 0 {
            (self.window + self.n_q - 1).min(self.kv_len())
        } else {
            self.kv_len()
        };
        if self.capacity < need {
            return Err(format!(
                "a cache of {} slots cannot hold the {need} keys this call reads",
                self.capacity
            ));
        }
        Ok(())
    }
}

/// A row-wise (elementwise, normalization, gather) problem: `rows` tokens of
/// `width` elements. `dtype` is the element type of the tensor the family
/// reads from a model file (the embedding table of `embed` and `ple`), F32
/// otherwise. `aux` is family-specific and documented by each family: the
/// table's row count (vocabulary) for `embed` and `ple`, the chunk width
/// for `ple` (PLE width P) and per-head norms, 0 when unused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowsProblem {
    pub rows: usize,
    pub width: usize,
    pub dtype: GgmlType,
    pub aux: usize,
}

/// One mixture-of-experts FFN call of a decode step (the `moe_route` and
/// `moe_gemv` families): `tokens` tokens of `d_model` features, `experts`
/// experts of which each token uses `used`, each expert a gated FFN of
/// width `ffn` (gate_up `[2*ffn][d_model]`, down `[d_model][ffn]`).
/// `wtype` is the type of the matrices the family reads: the router
/// (`ffn_gate_inp`) for `moe_route`, the expert tensors for `moe_gemv`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeProblem {
    pub tokens: usize,
    pub d_model: usize,
    pub ffn: usize,
    pub experts: usize,
    pub used: usize,
    pub wtype: GgmlType,
}

impl MoeProblem {
    /// The rejection reason of a shape no MoE layer can have.
    pub fn check(&self) -> Result<(), String> {
        if self.tokens == 0 || self.d_model == 0 || self.ffn == 0 || self.experts == 0 {
            return Err("tokens, d_model, ffn and experts must be positive".into());
        }
        if self.used == 0 || self.used > self.experts {
            return Err(format!(
                "used = {} experts per token must be in 1..={} (the expert count)",
                self.used, self.experts
            ));
        }
        Ok(())
    }
}

/// A problem shape a family can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Problem {
    Matmul(MatmulProblem),
    Attention(AttnProblem),
    Rows(RowsProblem),
    Moe(MoeProblem),
}

/// Which kind of shape a family runs on (its spec's shape files must hold
/// shapes of that kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProblemKind {
    Matmul,
    Attention,
    Rows,
    Moe,
}

impl ProblemKind {
    pub fn name(self) -> &'static str {
        match self {
            ProblemKind::Matmul => "matmul",
            ProblemKind::Attention => "attention",
            ProblemKind::Rows => "rows",
            ProblemKind::Moe => "moe",
        }
    }
}

impl Problem {
    pub fn matmul(m: usize, n: usize, k: usize, wtype: GgmlType) -> Problem {
        Problem::Matmul(MatmulProblem { m, n, k, wtype })
    }
    pub fn kind(&self) -> ProblemKind {
        match self {
            Problem::Matmul(_) => ProblemKind::Matmul,
            Problem::Attention(_) => ProblemKind::Attention,
            Problem::Rows(_) => ProblemKind::Rows,
            Problem::Moe(_) => ProblemKind::Moe,
        }
    }
    /// The generic report columns (m, n, k, type) of any problem:
    /// - matmul: tokens, output features, input features, weight type;
    /// - attention: query tokens, keys (`q_pos0 + n_q`), head dim, KV type;
    /// - rows: rows, width, aux, table type;
    /// - moe: tokens, experts, d_model, matrix type.
    pub fn columns(&self) -> (usize, usize, usize, String) {
        match self {
            Problem::Matmul(p) => (p.m, p.n, p.k, p.wtype.name().to_ascii_uppercase()),
            Problem::Attention(a) => (a.n_q, a.kv_len(), a.head_dim, a.kv_type.name().into()),
            Problem::Rows(r) => (r.rows, r.width, r.aux, r.dtype.name().to_ascii_uppercase()),
            Problem::Moe(e) => (
                e.tokens,
                e.experts,
                e.d_model,
                e.wtype.name().to_ascii_uppercase(),
            ),
        }
    }
    /// Every dimension, as one line (the `problem` column of reports).
    pub fn describe(&self) -> String {
        match self {
            Problem::Matmul(p) => format!(
                "matmul m={} n={} k={} w={}",
                p.m,
                p.n,
                p.k,
                p.wtype.name().to_ascii_uppercase()
            ),
            Problem::Attention(a) => format!(
                "attn heads={}/{} hd={} window={} q={}..{} cap={} kv={}",
                a.n_heads,
                a.n_kv_heads,
                a.head_dim,
                a.window,
                a.q_pos0,
                a.q_pos0 + a.n_q,
                a.capacity,
                a.kv_type.name()
            ),
            Problem::Rows(r) => format!(
                "rows={} width={} aux={} type={}",
                r.rows,
                r.width,
                r.aux,
                r.dtype.name().to_ascii_uppercase()
            ),
            Problem::Moe(e) => format!(
                "moe m={} d={} ffn={} experts={} used={} w={}",
                e.tokens,
                e.d_model,
                e.ffn,
                e.experts,
                e.used,
                e.wtype.name().to_ascii_uppercase()
            ),
        }
    }
}

/// The matmul problem of a matmul family's shape, or the reason it is not one.
pub(crate) fn matmul_of(p: &Problem) -> Result<&MatmulProblem, String> {
    match p {
        Problem::Matmul(mp) => Ok(mp),
        other => Err(wrong_kind(ProblemKind::Matmul, other)),
    }
}

/// The attention problem of an attention family's shape.
pub fn attn_of(p: &Problem) -> Result<&AttnProblem, String> {
    match p {
        Problem::Attention(a) => Ok(a),
        other => Err(wrong_kind(ProblemKind::Attention, other)),
    }
}

/// The rows problem of a row-wise family's shape.
pub fn rows_of(p: &Problem) -> Result<&RowsProblem, String> {
    match p {
        Problem::Rows(r) => Ok(r),
        other => Err(wrong_kind(ProblemKind::Rows, other)),
    }
}

/// The MoE problem of a MoE family's shape, checked (`MoeProblem::check`).
pub fn moe_of(p: &Problem) -> Result<&MoeProblem, String> {
    match p {
        Problem::Moe(e) => {
            e.check()?;
            Ok(e)
        }
        other => Err(wrong_kind(ProblemKind::Moe, other)),
    }
}

fn wrong_kind(want: ProblemKind, got: &Problem) -> String {
    format!(
        "this family runs on {} shapes, not on a {} shape ({})",
        want.name(),
        got.kind().name(),
        got.describe()
    )
}

/// Checks that the WTYPE define matches the problem's weight type and that
/// the type is one the matmul families implement (`WType`), with `k` a
/// positive multiple of the type's block (256 for the k-quants, 32 for
/// Q8_0/Q4_0, 1 for F16/BF16: the families add their own alignment rules).
pub(crate) fn check_wtype(d: &Defines, mp: &MatmulProblem) -> Result<WType, String> {
    let w = get_str(d, "WTYPE")?;
    let wt = match WType::ALL.iter().find(|t| t.define() == w) {
        Some(t) => *t,
        None => {
            if let Some(t) = WType::ALL
                .iter()
                .find(|t| t.define().eq_ignore_ascii_case(&w))
            {
                return Err(format!(
                    "WTYPE={w}: write it in upper case ({}), the kernel compares macro names",
                    t.define()
                ));
            }
            let names: Vec<&str> = WType::ALL.iter().map(|t| t.define()).collect();
            return Err(format!(
                "WTYPE={w}: the matmul families implement {}",
                names.join(", ")
            ));
        }
    };
    if wt.ggml() != mp.wtype {
        return Err(format!(
            "WTYPE={w} does not match the problem's weight type {}",
            mp.wtype.name()
        ));
    }
    let blk = wt.block_elems();
    if mp.k % blk != 0 || mp.k == 0 {
        return Err(format!(
            "k={} is not a positive multiple of the {blk}-element {} block",
            mp.k,
            wt.ggml().name()
        ));
    }
    if mp.m == 0 || mp.n == 0 {
        return Err("m and n must be positive".into());
    }
    Ok(wt)
}

/// `check_wtype` for the families that read Q8_0 and Q4_0 only (mmq: int8
/// MMA on per-32 int8 quants): the other types are rejected with the
/// families that serve them.
pub(crate) fn check_block32_wtype(
    family: &str,
    d: &Defines,
    mp: &MatmulProblem,
) -> Result<WType, String> {
    match check_wtype(d, mp)? {
        wt @ (WType::Q8_0 | WType::Q4_0) => Ok(wt),
        wt => Err(format!(
            "WTYPE={}: {family} reads Q8_0 and Q4_0 quant planes; {} weights are read by gemv, gemm_dq and gemm_wgmma",
            wt.define(),
            wt.define()
        )),
    }
}

/// The WTYPE define value for a weight type ("Q8_0", "Q4_0": the macro
/// names the kernels compare against, upper case).
pub fn wtype_define(t: GgmlType) -> DefineValue {
    DefineValue::Str(t.name().to_ascii_uppercase())
}

/// The weight types the matmul families implement, each read from its own
/// bits (GGUF blocks, or the lossless plane repacks of
/// `crate::quant::repack`; `bind::matmul` says which layout a variant
/// reads). The discriminants seed the check inputs, so new types go last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WType {
    Q8_0,
    Q4_0,
    Q6K,
    Q4K,
    Q5K,
    F16,
    Bf16,
}

impl WType {
    /// Every weight type, in discriminant order.
    pub const ALL: [WType; 7] = [
        WType::Q8_0,
        WType::Q4_0,
        WType::Q6K,
        WType::Q4K,
        WType::Q5K,
        WType::F16,
        WType::Bf16,
    ];
    pub fn ggml(self) -> GgmlType {
        match self {
            WType::Q8_0 => GgmlType::Q8_0,
            WType::Q4_0 => GgmlType::Q4_0,
            WType::Q6K => GgmlType::Q6K,
            WType::Q4K => GgmlType::Q4K,
            WType::Q5K => GgmlType::Q5K,
            WType::F16 => GgmlType::F16,
            WType::Bf16 => GgmlType::Bf16,
        }
    }
    /// The weight type of a GGML type, if the matmul families read it.
    pub fn of(t: GgmlType) -> Option<WType> {
        WType::ALL.into_iter().find(|w| w.ggml() == t)
    }
    /// The WTYPE define value ("Q8_0", "Q4_K", "BF16"): the macro name the
    /// kernels compare against.
    pub fn define(self) -> &'static str {
        match self {
            WType::Q8_0 => "Q8_0",
            WType::Q4_0 => "Q4_0",
            WType::Q6K => "Q6_K",
            WType::Q4K => "Q4_K",
            WType::Q5K => "Q5_K",
            WType::F16 => "F16",
            WType::Bf16 => "BF16",
        }
    }
    /// Q4_K, Q5_K or Q6_K (256-element super-blocks).
    pub fn is_kquant(self) -> bool {
        matches!(self, WType::Q4K | WType::Q5K | WType::Q6K)
    }
    /// F16 or BF16.
    pub fn is_16bit(self) -> bool {
        matches!(self, WType::F16 | WType::Bf16)
    }
    /// Elements per GGUF block (k must be a multiple).
    pub fn block_elems(self) -> usize {
        self.ggml().block_size()
    }
    /// Bytes of one GGUF row of `k` elements (`k` a multiple of
    /// `block_elems`).
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_elems() * self.ggml().type_size()
    }
    /// Bytes of the quant plane per 32 elements (scales apart): int8 for
    /// Q8_0, nibbles for Q4_0 and the k-quants (their low 4 bits; the high
    /// bits travel with the scales, `crate::quant::repack`), the values
    /// themselves for F16/BF16.
    pub fn quant_bytes_per_block(self) -> usize {
        match self {
            WType::Q8_0 => 32,
            WType::Q4_0 | WType::Q4K | WType::Q5K | WType::Q6K => 16,
            WType::F16 | WType::Bf16 => 64,
        }
    }
}
