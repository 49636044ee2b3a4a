//! `variants/shapes/*.toml`: named problem shapes and where they come from.
//!
//! ```toml
//! [tokens]                          # named token-count lists
//! N = [1, 2, 4, 8, 64, 512, 2048, 4096]
//!
//! [shapes]
//! e4b.ffn_up = { m = "N", n = 10240, k = 2560, wtype = "Q8_0", from = "blk.*.ffn_up.weight, E4B" }
//! ```
//!
//! Attention shapes name `heads`, `kv_heads`, `head_dim` and optionally
//! `window`, `q_pos0`, `capacity` (0 or absent: a linear cache) and `kv`
//! (F16, BF16, F32); row-wise shapes name `width` and optionally `dtype` and
//! `aux` (see `gemtune_kernels::family::RowsProblem`):
//!
//! ```toml
//! e4b.swa = { m = "T", heads = 8, kv_heads = 2, head_dim = 256, window = 512 }
//! e4b.norm = { m = "N", width = 2560 }
//! ```
//!
//! Mixture-of-experts shapes (`moe_route`, `moe_gemv`; see
//! `gemtune_kernels::family::MoeProblem`) name `experts`, `used`,
//! `d_model`, `ffn` and `wtype` (the router's type for `moe_route`, the
//! expert tensors' for `moe_gemv`):
//!
//! ```toml
//! a4b.route = { m = "N", experts = 128, used = 8, d_model = 2816, ffn = 704, wtype = "F32" }
//! ```
//!
//! `m` (tokens: matmul tokens, attention query tokens, rows) is a name from
//! `[tokens]`, an integer, or an array of integers. Dotted names (`e4b.ffn_up`) may be written bare: a table with
//! an `n` key is a shape, any other table is a group of shapes. Each shape
//! expands to one concrete problem per token count, named `e4b.ffn_up@m=2048`.

use super::doc::{as_array, as_i64, SpecError, Src, Tab};
use gemtune_kernels::family::{AttnProblem, KvType, MoeProblem, Problem, ProblemKind, RowsProblem};
use gemtune_kernels::quant::GgmlType;
use toml::de::DeValue;

/// What a shape definition describes besides its token counts.
#[derive(Clone, Debug, PartialEq)]
pub enum ShapeBody {
    /// `n`, `k`, `wtype`: a matmul over `m` tokens.
    Matmul { n: usize, k: usize, wtype: GgmlType },
    /// `heads`, `kv_heads`, `head_dim`, `window`, `q_pos0`, `capacity`, `kv`:
    /// an attention call with `m` query tokens (capacity 0: a linear cache
    /// of `q_pos0 + m` slots).
    Attention {
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        window: usize,
        q_pos0: usize,
        capacity: usize,
        kv_type: KvType,
    },
    /// `width`, `dtype`, `aux`: `m` rows of a row-wise kernel.
    Rows {
        width: usize,
        dtype: GgmlType,
        aux: usize,
    },
    /// `experts`, `used`, `d_model`, `ffn`, `wtype`: one MoE FFN call of
    /// `m` tokens.
    Moe {
        experts: usize,
        used: usize,
        d_model: usize,
        ffn: usize,
        wtype: GgmlType,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct ShapeDef {
    pub name: String,
    pub ms: Vec<usize>,
    pub body: ShapeBody,
    pub from: String,
    pub line: usize,
}

impl ShapeDef {
    /// The problem at `m` tokens (query tokens, rows).
    pub fn problem(&self, m: usize) -> Problem {
        match self.body {
            ShapeBody::Matmul { n, k, wtype } => Problem::matmul(m, n, k, wtype),
            ShapeBody::Attention {
                n_heads,
                n_kv_heads,
                head_dim,
                window,
                q_pos0,
                capacity,
                kv_type,
            } => Problem::Attention(AttnProblem {
                n_heads,
                n_kv_heads,
                head_dim,
                window,
                q_pos0,
                n_q: m,
                capacity: if capacity == 0 { q_pos0 + m } else { capacity },
                kv_type,
            }),
            ShapeBody::Rows { width, dtype, aux } => Problem::Rows(RowsProblem {
                rows: m,
                width,
                dtype,
                aux,
            }),
            ShapeBody::Moe {
                experts,
                used,
                d_model,
                ffn,
                wtype,
            } => Problem::Moe(MoeProblem {
                tokens: m,
                d_model,
                ffn,
                experts,
                used,
                wtype,
            }),
        }
    }
}

/// One concrete problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// `base@m=M`
    pub name: String,
    pub base: String,
    pub problem: Problem,
    /// The report columns of the problem (`Problem::columns`): for matmuls
    /// tokens, output and input features; for attention query tokens, keys
    /// and head dim; for row-wise kernels rows, width and aux.
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub from: String,
}

impl Shape {
    pub fn new(name: String, base: String, problem: Problem, from: String) -> Shape {
        let (m, n, k, _) = problem.columns();
        Shape {
            name,
            base,
            problem,
            m,
            n,
            k,
            from,
        }
    }
    pub fn problem(&self) -> Problem {
        self.problem
    }
    pub fn kind(&self) -> ProblemKind {
        self.problem.kind()
    }
    /// The type column and shape-bound define value: the weight type of a
    /// matmul ("Q8_0"), the K/V type of attention ("F16"), the table type of
    /// a row-wise kernel.
    pub fn wtype_define(&self) -> String {
        self.problem.columns().3
    }
    /// The weight type of a matmul or MoE shape.
    pub fn wtype(&self) -> Option<GgmlType> {
        match self.problem {
            Problem::Matmul(mp) => Some(mp.wtype),
            Problem::Moe(e) => Some(e.wtype),
            _ => None,
        }
    }
    /// The same shape with its token count capped at `cap` (checks keep the
    /// f64 oracle affordable this way): fewer tokens for a matmul or rows;
    /// for attention the last `cap` queries, so the keys, the window and
    /// the ring are those of the full call.
    pub fn capped(&self, cap: usize) -> Option<Problem> {
        match self.problem {
            Problem::Matmul(mut mp) if mp.m > cap => {
                mp.m = cap;
                Some(Problem::Matmul(mp))
            }
            Problem::Attention(mut a) if a.n_q > cap => {
                a.q_pos0 += a.n_q - cap;
                a.n_q = cap;
                Some(Problem::Attention(a))
            }
            Problem::Rows(mut r) if r.rows > cap => {
                r.rows = cap;
                Some(Problem::Rows(r))
            }
            Problem::Moe(mut e) if e.tokens > cap => {
                e.tokens = cap;
                Some(Problem::Moe(e))
            }
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ShapesFile {
    pub file: String,
    pub sha256: String,
    pub defs: Vec<ShapeDef>,
}

fn non_negative(
    src: Src<'_>,
    v: Option<&super::doc::SVal<'_>>,
    what: &str,
) -> Result<usize, SpecError> {
    let Some(v) = v else { return Ok(0) };
    let x = as_i64(src, v, what)?;
    if x < 0 {
        return Err(src.err(v.span(), format!("`{what}` must be 0 or more, got {x}")));
    }
    Ok(x as usize)
}

fn positive(src: Src<'_>, v: &super::doc::SVal<'_>, what: &str) -> Result<usize, SpecError> {
    let x = as_i64(src, v, what)?;
    if x <= 0 {
        return Err(src.err(v.span(), format!("`{what}` must be positive, got {x}")));
    }
    Ok(x as usize)
}

impl ShapesFile {
    pub fn parse(file: &str, text: &str) -> Result<ShapesFile, SpecError> {
        let src = Src { file, text };
        let doc = src.parse()?;
        let mut root = Tab::new(src, doc.get_ref(), "the file");
        let mut tokens: Vec<(String, Vec<usize>)> = Vec::new();
        if let Some(v) = root.get("tokens") {
            let mut t = Tab::of(src, v, "[tokens]")?;
            for (k, lv) in t.entries() {
                let mut list = Vec::new();
                for e in as_array(src, lv, k.get_ref())? {
                    list.push(positive(src, e, k.get_ref())?);
                }
                if list.is_empty() {
                    return Err(src.err(lv.span(), format!("token list {} is empty", k.get_ref())));
                }
                tokens.push((k.get_ref().to_string(), list));
            }
        }
        let shapes_v = root.req("shapes")?;
        let mut defs = Vec::new();
        walk(src, shapes_v, "", &tokens, &mut defs)?;
        root.finish("tokens, shapes")?;
        if defs.is_empty() {
            return Err(src.err(shapes_v.span(), "[shapes] defines no shape"));
        }
        Ok(ShapesFile {
            file: file.to_string(),
            sha256: crate::hash::sha256_hex(text.as_bytes()),
            defs,
        })
    }

    /// Every (shape, token count), in file order then token order.
    pub fn expand(&self) -> Vec<Shape> {
        let mut out = Vec::new();
        for d in &self.defs {
            for &m in &d.ms {
                out.push(Shape::new(
                    format!("{}@m={m}", d.name),
                    d.name.clone(),
                    d.problem(m),
                    d.from.clone(),
                ));
            }
        }
        out
    }
}

/// Every key a shape may have (of any kind).
const SHAPE_KEYS: &[&str] = &[
    "m", "n", "k", "wtype", "heads", "kv_heads", "head_dim", "window", "q_pos0", "capacity", "kv",
    "width", "dtype", "aux", "experts", "used", "d_model", "ffn", "from",
];

/// The error for a shape with none of `n`, `heads`, `width`: its first
/// key that no shape has (with the nearest one it may have meant), else
/// what is missing.
fn unkinded_shape(src: Src<'_>, tab: &toml::de::DeTable<'_>, name: &str) -> SpecError {
    let mut keys: Vec<_> = tab.iter().map(|(k, _)| k).collect();
    keys.sort_by_key(|k| k.span().start);
    if let Some(k) = keys
        .iter()
        .find(|k| !SHAPE_KEYS.contains(&k.get_ref().as_ref()))
    {
        let key = k.get_ref().as_ref();
        let hint = SHAPE_KEYS
            .iter()
            .map(|c| (edit_distance(key, c), *c))
            .filter(|(d, _)| *d <= 2)
            .min()
            .map(|(_, c)| format!(" (did you mean `{c}`?)"))
            .unwrap_or_default();
        return src.err(
            k.span(),
            format!(
                "unknown key `{key}` in shape `{name}`{hint}; a shape has m and n/k/wtype (matmul), heads/kv_heads/head_dim (attention), width (rows) or experts/used/d_model/ffn/wtype (moe)"
            ),
        );
    }
    let span = keys.first().map(|k| k.span()).unwrap_or(0..0);
    src.err(
        span,
        format!("shape `{name}` has none of `n` (matmul), `heads` (attention), `width` (rows) or `experts` (moe)"),
    )
}

/// Levenshtein distance over chars (short keys only).
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn walk(
    src: Src<'_>,
    v: &super::doc::SVal<'_>,
    prefix: &str,
    tokens: &[(String, Vec<usize>)],
    out: &mut Vec<ShapeDef>,
) -> Result<(), SpecError> {
    let DeValue::Table(tab) = v.get_ref() else {
        return Err(src.err(
            v.span(),
            format!("shape `{prefix}` must be a table like {{ m = \"N\", n = 10240, k = 2560, wtype = \"Q8_0\" }}"),
        ));
    };
    // A kind key holding a plain value makes a shape; holding a table it
    // is a group's member (a shape named `experts`, say).
    let is_shape = ["n", "heads", "width", "experts"].iter().any(|k| {
        tab.get(*k)
            .is_some_and(|v| !matches!(v.get_ref(), DeValue::Table(_)))
    });
    // A table with a plain value in it is a shape, even when a typo hides
    // the key that says which kind: name the key that is wrong.
    if !is_shape
        && tab
            .iter()
            .any(|(_, v)| !matches!(v.get_ref(), DeValue::Table(_)))
    {
        return Err(unkinded_shape(src, tab, prefix));
    }
    if is_shape {
        let what = format!("shape `{prefix}`");
        let mut t = Tab::new(src, tab, what.clone());
        let mv = t.req("m")?;
        let ms = match mv.get_ref() {
            DeValue::String(s) => tokens
                .iter()
                .find(|(n, _)| n == s.as_ref())
                .map(|(_, l)| l.clone())
                .ok_or_else(|| {
                    src.err(mv.span(), format!("m = \"{s}\" names no list in [tokens]"))
                })?,
            DeValue::Array(a) => {
                let mut l = Vec::new();
                for e in a.iter() {
                    l.push(positive(src, e, "m")?);
                }
                l
            }
            _ => vec![positive(src, mv, "m")?],
        };
        let ggml = |t: &mut Tab<'_, '_>, key: &str| -> Result<GgmlType, SpecError> {
            let (w, wspan) = t.str_req(key)?;
            GgmlType::from_name(&w.to_ascii_lowercase())
                .ok_or_else(|| src.err(wspan, format!("{key} `{w}` is not a ggml type name")))
        };
        let (body, keys) = if tab.get("n").is_some() {
            let n = positive(src, t.req("n")?, "n")?;
            let k = positive(src, t.req("k")?, "k")?;
            let wtype = ggml(&mut t, "wtype")?;
            (ShapeBody::Matmul { n, k, wtype }, "m, n, k, wtype, from")
        } else if tab.get("heads").is_some() {
            let n_heads = positive(src, t.req("heads")?, "heads")?;
            let n_kv_heads = positive(src, t.req("kv_heads")?, "kv_heads")?;
            let head_dim = positive(src, t.req("head_dim")?, "head_dim")?;
            let window = non_negative(src, t.get("window"), "window")?;
            let q_pos0 = non_negative(src, t.get("q_pos0"), "q_pos0")?;
            let capacity = non_negative(src, t.get("capacity"), "capacity")?;
            let kv_type = match t.str_opt("kv")? {
                None => KvType::F16,
                Some((s, span)) => KvType::from_name(&s).ok_or_else(|| {
                    src.err(span, format!("kv `{s}` is not one of F16, BF16, F32"))
                })?,
            };
            if n_heads % n_kv_heads != 0 {
                return Err(src.err(
                    v.span(),
                    format!("{what}: kv_heads = {n_kv_heads} does not divide heads = {n_heads}"),
                ));
            }
            (
                ShapeBody::Attention {
                    n_heads,
                    n_kv_heads,
                    head_dim,
                    window,
                    q_pos0,
                    capacity,
                    kv_type,
                },
                "m, heads, kv_heads, head_dim, window, q_pos0, capacity, kv, from",
            )
        } else if tab.get("experts").is_some() {
            let experts = positive(src, t.req("experts")?, "experts")?;
            let used = positive(src, t.req("used")?, "used")?;
            let d_model = positive(src, t.req("d_model")?, "d_model")?;
            let ffn = positive(src, t.req("ffn")?, "ffn")?;
            let wtype = ggml(&mut t, "wtype")?;
            if used > experts {
                return Err(src.err(
                    v.span(),
                    format!("{what}: used = {used} exceeds experts = {experts}"),
                ));
            }
            (
                ShapeBody::Moe {
                    experts,
                    used,
                    d_model,
                    ffn,
                    wtype,
                },
                "m, experts, used, d_model, ffn, wtype, from",
            )
        } else {
            let width = positive(src, t.req("width")?, "width")?;
            let dtype = if t.key_span("dtype").is_some() {
                ggml(&mut t, "dtype")?
            } else {
                GgmlType::F32
            };
            let aux = non_negative(src, t.get("aux"), "aux")?;
            (
                ShapeBody::Rows { width, dtype, aux },
                "m, width, dtype, aux, from",
            )
        };
        let from = t.str_opt("from")?.map(|(s, _)| s).unwrap_or_default();
        let line = src.line_of(
            &tab.iter()
                .map(|(k, _)| k.span())
                .min_by_key(|s| s.start)
                .unwrap_or(0..0),
        );
        t.finish(keys)?;
        if let Some(prev) = out.iter().find(|d| d.name == prefix) {
            return Err(src.err(
                v.span(),
                format!(
                    "shape `{prefix}` is defined twice (first on line {})",
                    prev.line
                ),
            ));
        }
        out.push(ShapeDef {
            name: prefix.to_string(),
            ms,
            body,
            from,
            line,
        });
        return Ok(());
    }
    let mut entries: Vec<_> = tab.iter().collect();
    entries.sort_by_key(|(k, _)| k.span().start);
    for (k, sub) in entries {
        let name = if prefix.is_empty() {
            k.get_ref().to_string()
        } else {
            format!("{prefix}.{}", k.get_ref())
        };
        if name.contains(['@', ' ', ',']) {
            return Err(src.err(
                k.span(),
                format!("shape name `{name}` must not contain '@', ',' or spaces"),
            ));
        }
        if !matches!(sub.get_ref(), DeValue::Table(_)) {
            return Err(src.err(
                k.span(),
                format!(
                    "unknown key `{}` in {} (a shape is a table with m and n/k/wtype (matmul), heads/kv_heads/head_dim (attention), width (rows) or experts/used/d_model/ffn/wtype (moe))",
                    k.get_ref(),
                    if prefix.is_empty() {
                        "[shapes]".to_string()
                    } else {
                        format!("group `{prefix}`")
                    }
                ),
            ));
        }
        walk(src, sub, &name, tokens, out)?;
    }
    Ok(())
}
