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
//! `m` (tokens) is a name from `[tokens]`, an integer, or an array of
//! integers. Dotted names (`e4b.ffn_up`) may be written bare: a table with
//! an `n` key is a shape, any other table is a group of shapes. Each shape
//! expands to one concrete problem per token count, named `e4b.ffn_up@m=2048`.

use super::doc::{as_array, as_i64, SpecError, Src, Tab};
use gemtune_kernels::family::Problem;
use gemtune_kernels::quant::GgmlType;
use toml::de::DeValue;

#[derive(Clone, Debug, PartialEq)]
pub struct ShapeDef {
    pub name: String,
    pub ms: Vec<usize>,
    pub n: usize,
    pub k: usize,
    pub wtype: GgmlType,
    pub from: String,
    pub line: usize,
}

/// One concrete problem.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// `base@m=M`
    pub name: String,
    pub base: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub wtype: GgmlType,
    pub from: String,
}

impl Shape {
    pub fn problem(&self) -> Problem {
        Problem::matmul(self.m, self.n, self.k, self.wtype)
    }
    /// The `WTYPE` define value for this shape ("Q8_0").
    pub fn wtype_define(&self) -> String {
        self.wtype.name().to_uppercase()
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ShapesFile {
    pub file: String,
    pub sha256: String,
    pub defs: Vec<ShapeDef>,
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
                out.push(Shape {
                    name: format!("{}@m={m}", d.name),
                    base: d.name.clone(),
                    m,
                    n: d.n,
                    k: d.k,
                    wtype: d.wtype,
                    from: d.from.clone(),
                });
            }
        }
        out
    }
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
    if tab.get("n").is_some() {
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
        let n = positive(src, t.req("n")?, "n")?;
        let k = positive(src, t.req("k")?, "k")?;
        let (w, wspan) = t.str_req("wtype")?;
        let wtype = GgmlType::from_name(&w)
            .ok_or_else(|| src.err(wspan, format!("wtype `{w}` is not a ggml type name")))?;
        let from = t.str_opt("from")?.map(|(s, _)| s).unwrap_or_default();
        let line = src.line_of(
            &tab.iter()
                .map(|(k, _)| k.span())
                .min_by_key(|s| s.start)
                .unwrap_or(0..0),
        );
        t.finish("m, n, k, wtype, from")?;
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
            n,
            k,
            wtype,
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
                    "unknown key `{}` in {} (a shape is a table with m, n, k, wtype, from)",
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
