//! Sweep expansion with stable ids, and the per-shape plan that lists every
//! rejected point with the family's reason.
//!
//! Ids: a named variant's id is its name; a sweep point's id is
//! `base+AXIS=V,AXIS=V` with the axes sorted by name, so reordering axes in
//! the file does not change ids. `hash` is the first 8 hex digits of
//! sha256(family, canonical spec-level defines): equal defines give equal
//! hashes whatever they are called, which is how duplicates are found.

use super::family::{FamilySpec, SHAPE_BOUND_DEFINES};
use super::shapes::Shape;
use gemtune_kernels::defines::{canonical, DefineValue, Defines};
use gemtune_kernels::family::{Contract, DeviceLimits, Family, LaunchGeometry};

#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub id: String,
    pub hash: String,
    /// The named variant this point starts from (itself for named variants).
    pub base: String,
    /// A `[[variant]]` (as opposed to a sweep point).
    pub named: bool,
    /// Spec-level defines: no shape-bound ones.
    pub defines: Defines,
    /// Contract asserted by the spec for this point, if any.
    pub contract: Option<Contract>,
    /// Set when an earlier point has identical defines; such points are listed
    /// but not compiled or run again.
    pub duplicate_of: Option<String>,
}

pub fn define_hash(family: &str, d: &Defines) -> String {
    let h = crate::hash::sha256_hex(format!("{family}\n{}", canonical(d)).as_bytes());
    h[..8].to_string()
}

/// Named variants in file order, then each sweep's points (bases in order,
/// then the cartesian product with the last axis varying fastest).
pub fn expand(spec: &FamilySpec) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    let push = |out: &mut Vec<Point>, mut p: Point| {
        if let Some(prev) = out.iter().find(|q| q.defines == p.defines) {
            p.duplicate_of = Some(prev.id.clone());
        }
        if out.iter().any(|q| q.id == p.id) {
            return;
        }
        out.push(p);
    };
    for v in &spec.variants {
        let d = spec.variant_defines(v);
        let p = Point {
            id: v.name.clone(),
            hash: define_hash(&spec.family, &d),
            base: v.name.clone(),
            named: true,
            defines: d,
            contract: v.contract.or(spec.contract).map(|c| c.0),
            duplicate_of: None,
        };
        push(&mut out, p);
    }
    for s in &spec.sweeps {
        for (bname, _, _) in &s.base {
            let Some(bv) = spec.variants.iter().find(|v| &v.name == bname) else {
                continue;
            };
            let bdef = spec.variant_defines(bv);
            let mut idx = vec![0usize; s.axes.len()];
            loop {
                let mut d = bdef.clone();
                let mut parts: Vec<(String, DefineValue)> = Vec::new();
                for (a, &i) in s.axes.iter().zip(&idx) {
                    d.insert(a.name.clone(), a.values[i].clone());
                    parts.push((a.name.clone(), a.values[i].clone()));
                }
                parts.sort();
                let id = format!(
                    "{bname}+{}",
                    parts
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(",")
                );
                push(
                    &mut out,
                    Point {
                        id,
                        hash: define_hash(&spec.family, &d),
                        base: bname.clone(),
                        named: false,
                        defines: d,
                        contract: bv.contract.or(spec.contract).map(|c| c.0),
                        duplicate_of: None,
                    },
                );
                // Advance the odometer, last axis fastest.
                let mut advanced = false;
                for j in (0..s.axes.len()).rev() {
                    idx[j] += 1;
                    if idx[j] < s.axes[j].values.len() {
                        advanced = true;
                        break;
                    }
                    idx[j] = 0;
                }
                if !advanced {
                    break;
                }
            }
        }
    }
    out
}

/// The full defines a point runs with on a shape: spec-level defines plus
/// the shape-bound ones the family declares.
pub fn resolve(p: &Point, shape: &Shape, declared: &[String]) -> Defines {
    let mut d = p.defines.clone();
    let bound: Vec<(&str, DefineValue)> = match shape.problem {
        gemtune_kernels::Problem::Attention(a) => vec![
            ("KV_TYPE", DefineValue::Str(shape.wtype_define())),
            ("HEAD_DIM", DefineValue::Int(a.head_dim as i64)),
        ],
        _ => vec![("WTYPE", DefineValue::Str(shape.wtype_define()))],
    };
    for (b, v) in bound {
        if SHAPE_BOUND_DEFINES.contains(&b) && declared.iter().any(|x| x == b) {
            d.insert(b.to_string(), v);
        }
    }
    d
}

/// One (point, shape) cell of a plan.
#[derive(Clone, Debug)]
pub struct Cell {
    pub point: usize,
    pub shape: usize,
    pub defines: Defines,
    pub outcome: Result<LaunchGeometry, String>,
}

/// Validates every non-duplicate point on every shape. Rejections are kept
/// with their reason.
pub fn plan(f: &dyn Family, points: &[Point], shapes: &[Shape], lim: &DeviceLimits) -> Vec<Cell> {
    let declared = f.declared_defines();
    let mut out = Vec::new();
    for (pi, p) in points.iter().enumerate() {
        if p.duplicate_of.is_some() {
            continue;
        }
        for (si, s) in shapes.iter().enumerate() {
            let d = resolve(p, s, &declared);
            let outcome = f.validate(&d, &s.problem(), lim);
            out.push(Cell {
                point: pi,
                shape: si,
                defines: d,
                outcome,
            });
        }
    }
    out
}
