//! `variants/<family>.toml`: a kernel family's variants.
//!
//! ```toml
//! [kernel]
//! family = "mmq"              # must name a registered family
//! entry = "mmq_gemm"          # optional; must match the family's entry
//! contract = "approx"         # optional; asserted against the kernel's own contract
//! forbid_spills = true        # optional; spills make a variant fail
//! shapes = ["ffn.toml"]       # default shapes files when --shapes is not given
//! shape_prefix = "rmsnorm."   # optional; only shapes whose name starts with it
//! tolerance = { rms_rel = 2e-2 }   # optional overrides of the family's tolerance
//!
//! [defaults]                  # every variant starts from these defines
//! BM = 128
//!
//! [[variant]]
//! name = "baseline"           # required: always present
//! defines = { BM = 64 }
//! contract = "fp"             # optional per-variant assertion
//!
//! [sweep]                     # or [[sweep]] for several
//! base = ["baseline"]         # variants the axes are applied on top of
//! BM = [64, 128]
//! ```
//!
//! `WTYPE` and `KV_TYPE` are bound to the shape: the harness sets them from
//! the shape's weight (or table) type and K/V type, so a spec must not set them (a variant that only supports one type is
//! rejected on the others by the family's `validate`, with its reason).

use super::doc::{as_array, as_define, as_str, SpecError, Src, Tab};
use gemtune_kernels::defines::DefineValue;
use gemtune_kernels::family::Contract;
use std::collections::BTreeMap;
use toml::de::DeValue;

/// Defines the harness sets from the shape, never from the spec.
/// `WTYPE`: the weight type of a matmul shape or the table type of a
/// row-wise shape; `KV_TYPE` and `HEAD_DIM`: the K/V cache type and the head
/// width of an attention shape.
pub const SHAPE_BOUND_DEFINES: &[&str] = &["WTYPE", "KV_TYPE", "HEAD_DIM"];

/// A define as written in the spec, with the line it is on.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecDefine {
    pub name: String,
    pub value: DefineValue,
    pub line: usize,
    pub col: usize,
}

/// Field-by-field overrides of the family's derived tolerance.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ToleranceOverride {
    pub rms_rel: Option<f64>,
    pub max_rel: Option<f64>,
    pub outlier_frac: Option<f64>,
    pub replay_rms_rel: Option<f64>,
}

impl ToleranceOverride {
    pub fn apply(&self, t: &mut gemtune_kernels::check::Tolerance) {
        if let Some(v) = self.rms_rel {
            t.rms_rel = v;
        }
        if let Some(v) = self.max_rel {
            t.max_rel = v;
        }
        if let Some(v) = self.outlier_frac {
            t.outlier_frac = v;
        }
        if let Some(v) = self.replay_rms_rel {
            t.replay_rms_rel = v;
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct VariantSpec {
    pub name: String,
    pub line: usize,
    pub description: Option<String>,
    pub contract: Option<(Contract, usize)>,
    pub defines: Vec<SpecDefine>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SweepAxis {
    pub name: String,
    pub values: Vec<DefineValue>,
    pub line: usize,
    pub col: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SweepSpec {
    pub line: usize,
    /// (variant name, line, col)
    pub base: Vec<(String, usize, usize)>,
    /// In file order.
    pub axes: Vec<SweepAxis>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FamilySpec {
    /// The path as given (used in every message).
    pub file: String,
    /// sha256 of the file's bytes, hex: the spec hash in provenance.
    pub sha256: String,
    pub family: String,
    pub family_line: usize,
    pub entry: Option<(String, usize)>,
    pub contract: Option<(Contract, usize)>,
    pub forbid_spills: bool,
    pub shapes: Vec<String>,
    /// Only shapes whose name starts with this (several families sharing one
    /// shapes file, e.g. elementwise.toml); empty: every shape of the kind.
    pub shape_prefix: String,
    pub tolerance: ToleranceOverride,
    pub defaults: Vec<SpecDefine>,
    pub variants: Vec<VariantSpec>,
    pub sweeps: Vec<SweepSpec>,
}

pub fn parse_contract(s: &str) -> Option<Contract> {
    match s {
        "bitexact" => Some(Contract::Bitexact),
        "fp" => Some(Contract::Fp),
        "approx" => Some(Contract::Approx),
        _ => None,
    }
}

pub fn contract_name(c: Contract) -> &'static str {
    match c {
        Contract::Bitexact => "bitexact",
        Contract::Fp => "fp",
        Contract::Approx => "approx",
    }
}

fn read_defines(src: Src<'_>, tab: &mut Tab<'_, '_>) -> Result<Vec<SpecDefine>, SpecError> {
    let mut out = Vec::new();
    for (k, v) in tab.entries() {
        let name = k.get_ref().to_string();
        let (line, col) = src.line_col(k.span().start);
        if SHAPE_BOUND_DEFINES.contains(&name.as_str()) {
            return Err(src.err(
                k.span(),
                format!(
                    "define {name} is set from each shape's type; remove it from the spec \
                     (choose weight and K/V types in the shapes file)"
                ),
            ));
        }
        let value = as_define(src, v, &name)?;
        out.push(SpecDefine {
            name,
            value,
            line,
            col,
        });
    }
    Ok(out)
}

fn read_contract(
    src: Src<'_>,
    tab: &mut Tab<'_, '_>,
) -> Result<Option<(Contract, usize)>, SpecError> {
    match tab.str_opt("contract")? {
        None => Ok(None),
        Some((s, span)) => match parse_contract(&s) {
            Some(c) => Ok(Some((c, src.line_of(&span)))),
            None => Err(src.err(
                span,
                format!("contract `{s}` is not one of bitexact, fp, approx"),
            )),
        },
    }
}

impl FamilySpec {
    /// Parses a family spec. Syntax, types, unknown keys and the structure
    /// (a `baseline` variant, sweep bases that exist, no duplicate names) are
    /// checked here; the define names are checked by `check_declared`.
    pub fn parse(file: &str, text: &str) -> Result<FamilySpec, SpecError> {
        let src = Src { file, text };
        let doc = src.parse()?;
        let mut root = Tab::new(src, doc.get_ref(), "the file");

        let kernel_v = root.req("kernel")?;
        let mut k = Tab::of(src, kernel_v, "[kernel]")?;
        let (family, fspan) = k.str_req("family")?;
        let entry = k.str_opt("entry")?.map(|(s, sp)| (s, src.line_of(&sp)));
        let contract = read_contract(src, &mut k)?;
        let forbid_spills = k.bool_opt("forbid_spills")?.unwrap_or(false);
        let mut shapes = Vec::new();
        if let Some(v) = k.get("shapes") {
            for e in as_array(src, v, "shapes")? {
                shapes.push(as_str(src, e, "shapes")?);
            }
        }
        let mut tolerance = ToleranceOverride::default();
        if let Some(v) = k.get("tolerance") {
            let mut t = Tab::of(src, v, "[kernel.tolerance]")?;
            tolerance.rms_rel = t.f64_opt("rms_rel")?;
            tolerance.max_rel = t.f64_opt("max_rel")?;
            tolerance.outlier_frac = t.f64_opt("outlier_frac")?;
            tolerance.replay_rms_rel = t.f64_opt("replay_rms_rel")?;
            t.finish("rms_rel, max_rel, outlier_frac, replay_rms_rel")?;
        }
        k.get("description");
        let shape_prefix = k
            .str_opt("shape_prefix")?
            .map(|(s, _)| s)
            .unwrap_or_default();
        k.finish(
            "family, entry, contract, forbid_spills, shapes, shape_prefix, tolerance, description",
        )?;

        let defaults = match root.get("defaults") {
            None => Vec::new(),
            Some(v) => {
                let mut t = Tab::of(src, v, "[defaults]")?;
                read_defines(src, &mut t)?
            }
        };

        let mut variants: Vec<VariantSpec> = Vec::new();
        if let Some(v) = root.get("variant") {
            for item in as_array(src, v, "variant")? {
                let mut t = Tab::of(src, item, "[[variant]]")?;
                let (name, nspan) = t.str_req("name")?;
                if name.is_empty() || name.contains(['+', ',', '=', ' ', '@']) {
                    return Err(src.err(
                        nspan,
                        format!("variant name `{name}` must be non-empty and free of '+', ',', '=', '@' and spaces"),
                    ));
                }
                if let Some(prev) = variants.iter().find(|p| p.name == name) {
                    return Err(src.err(
                        nspan,
                        format!(
                            "variant `{name}` is defined twice (first on line {})",
                            prev.line
                        ),
                    ));
                }
                let description = t.str_opt("description")?.map(|(s, _)| s);
                let contract = read_contract(src, &mut t)?;
                let defines = match t.get("defines") {
                    None => Vec::new(),
                    Some(dv) => {
                        let mut dt = Tab::of(src, dv, format!("variant `{name}` defines"))?;
                        read_defines(src, &mut dt)?
                    }
                };
                t.finish("name, description, contract, defines")?;
                variants.push(VariantSpec {
                    name,
                    line: src.line_of(&nspan),
                    description,
                    contract,
                    defines,
                });
            }
        }
        if !variants.iter().any(|v| v.name == "baseline") {
            return Err(src.err(
                fspan.clone(),
                "no [[variant]] named `baseline` (every family keeps its simplest correct variant)",
            ));
        }

        let mut sweeps = Vec::new();
        if let Some(v) = root.get("sweep") {
            let items: Vec<&super::doc::SVal<'_>> = match v.get_ref() {
                DeValue::Array(a) => a.iter().collect(),
                _ => vec![v],
            };
            for item in items {
                let mut t = Tab::of(src, item, "[sweep]")?;
                let mut base = Vec::new();
                let base_v = t.req("base")?;
                for b in as_array(src, base_v, "base")? {
                    let name = as_str(src, b, "base")?;
                    if !variants.iter().any(|v| v.name == name) {
                        return Err(src.err(
                            b.span(),
                            format!("sweep base `{name}` names no [[variant]]"),
                        ));
                    }
                    let (l, c) = src.line_col(b.span().start);
                    base.push((name, l, c));
                }
                if base.is_empty() {
                    return Err(src.err(base_v.span(), "sweep `base` is empty"));
                }
                let mut axes = Vec::new();
                for (key, val) in t.entries() {
                    let name = key.get_ref().to_string();
                    if name == "base" {
                        continue;
                    }
                    if SHAPE_BOUND_DEFINES.contains(&name.as_str()) {
                        return Err(src.err(
                            key.span(),
                            format!(
                                "define {name} is set from each shape's type; it cannot be swept"
                            ),
                        ));
                    }
                    let arr = as_array(src, val, &name)?;
                    if arr.is_empty() {
                        return Err(src.err(val.span(), format!("sweep axis {name} is empty")));
                    }
                    let mut values = Vec::new();
                    for e in arr {
                        let dv = as_define(src, e, &name)?;
                        if values.contains(&dv) {
                            return Err(
                                src.err(e.span(), format!("sweep axis {name} repeats {dv}"))
                            );
                        }
                        values.push(dv);
                    }
                    let (line, col) = src.line_col(key.span().start);
                    axes.push(SweepAxis {
                        name,
                        values,
                        line,
                        col,
                    });
                }
                if axes.is_empty() {
                    return Err(src.err(item.span(), "[sweep] has no axes besides `base`"));
                }
                sweeps.push(SweepSpec {
                    line: src.line_of(&item.span()),
                    base,
                    axes,
                });
            }
        }
        root.finish("kernel, defaults, variant, sweep")?;

        Ok(FamilySpec {
            file: file.to_string(),
            sha256: crate::hash::sha256_hex(text.as_bytes()),
            family,
            family_line: src.line_of(&fspan),
            entry,
            contract,
            forbid_spills,
            shapes,
            shape_prefix,
            tolerance,
            defaults,
            variants,
            sweeps,
        })
    }

    /// Every define key used anywhere must be in the family's `Defines:`
    /// block; the error names the line of the first one that is not.
    pub fn check_declared(&self, declared: &[String], source_file: &str) -> Result<(), SpecError> {
        let bad = |name: &str, line: usize, col: usize| SpecError {
            file: self.file.clone(),
            line,
            col,
            msg: format!(
                "define {name} is not declared in {source_file}'s Defines: block (declared: {})",
                declared.join(", ")
            ),
        };
        let all = self
            .defaults
            .iter()
            .chain(self.variants.iter().flat_map(|v| v.defines.iter()));
        for d in all {
            if !declared.iter().any(|x| x == &d.name) {
                return Err(bad(&d.name, d.line, d.col));
            }
        }
        for s in &self.sweeps {
            for a in &s.axes {
                if !declared.iter().any(|x| x == &a.name) {
                    return Err(bad(&a.name, a.line, a.col));
                }
            }
        }
        Ok(())
    }

    /// The spec-level defines of a named variant: [defaults] overlaid with the
    /// variant's own (no shape-bound defines).
    pub fn variant_defines(&self, v: &VariantSpec) -> BTreeMap<String, DefineValue> {
        let mut d: BTreeMap<String, DefineValue> = self
            .defaults
            .iter()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect();
        for x in &v.defines {
            d.insert(x.name.clone(), x.value.clone());
        }
        d
    }
}
