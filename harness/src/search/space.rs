//! The finite space one search runs over: the points a family's spec expands
//! to (named variants and every `[[sweep]]`'s cartesian product, duplicates
//! removed) that the family accepts on one shape, each described by its
//! defines.
//!
//! A family's points are a union of cartesian products (one per sweep and
//! base) plus hand-written variants, so the space is a list of points, not a
//! product: a strategy that builds a new define combination (crossover,
//! mutation) maps it back onto the nearest listed point. Every define that
//! varies over the points is one dimension; one that is the same everywhere
//! says nothing about the objective and is dropped.

use gemtune_kernels::defines::{DefineValue, Defines};
use std::collections::HashMap;

/// How distances along a dimension are measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimKind {
    /// Integer values: position in the sorted list of values (a rank, so
    /// 16, 32, 64 are as far apart as 1, 2, 4 and `SPLITS = 0` (auto) sits
    /// below the explicit counts).
    Ordinal,
    /// Any other value (a type name, or a define some points leave unset),
    /// and an integer define whose values are exactly 0, 1, .., n-1 with
    /// n >= 3: a numbered list of algorithms (`ALGO`), whose numbers say
    /// nothing about how close two of them are. Equal or different.
    Categorical,
}

/// One varying define: its distinct values (sorted; `None` is "unset").
#[derive(Clone, Debug, PartialEq)]
pub struct Dim {
    pub name: String,
    pub values: Vec<Option<DefineValue>>,
    pub kind: DimKind,
}

/// A list of points with their coordinates (one value index per dimension)
/// and the feature vectors the model-based strategies use.
#[derive(Clone, Debug)]
pub struct Space {
    dims: Vec<Dim>,
    labels: Vec<String>,
    coords: Vec<Vec<usize>>,
    features: Vec<Vec<f64>>,
    index: HashMap<Vec<usize>, usize>,
}

impl Space {
    /// Points in the given order, each `(label, defines)`. Two points with
    /// the same defines are one point to every strategy: the first is kept.
    pub fn from_defines(points: &[(String, Defines)]) -> Space {
        let mut names: Vec<&String> = points.iter().flat_map(|(_, d)| d.keys()).collect();
        names.sort();
        names.dedup();
        let mut dims = Vec::new();
        for name in names {
            let mut values: Vec<Option<DefineValue>> =
                points.iter().map(|(_, d)| d.get(name).cloned()).collect();
            values.sort();
            values.dedup();
            if values.len() < 2 {
                continue;
            }
            let ints: Option<Vec<i64>> = values
                .iter()
                .map(|v| match v {
                    Some(DefineValue::Int(i)) => Some(*i),
                    _ => None,
                })
                .collect();
            let kind = match ints {
                Some(v) if !is_enumeration(&v) => DimKind::Ordinal,
                _ => DimKind::Categorical,
            };
            dims.push(Dim {
                name: name.clone(),
                values,
                kind,
            });
        }
        let mut space = Space {
            dims,
            labels: Vec::new(),
            coords: Vec::new(),
            features: Vec::new(),
            index: HashMap::new(),
        };
        for (label, d) in points {
            let c: Vec<usize> = space
                .dims
                .iter()
                .map(|dim| {
                    let v = d.get(&dim.name).cloned();
                    dim.values.iter().position(|x| *x == v).unwrap_or(0)
                })
                .collect();
            if space.index.contains_key(&c) {
                continue;
            }
            space.index.insert(c.clone(), space.coords.len());
            space.features.push(space.features_of(&c));
            space.coords.push(c);
            space.labels.push(label.clone());
        }
        space
    }

    /// The full cartesian product of integer axes, last axis fastest (the
    /// order `[[sweep]]` expands in); labels are `A=1,B=2`.
    pub fn grid(axes: &[(&str, &[i64])]) -> Space {
        let mut points: Vec<(String, Defines)> = vec![(String::new(), Defines::new())];
        for (name, values) in axes {
            let mut next = Vec::with_capacity(points.len() * values.len());
            for (label, d) in &points {
                for &v in values.iter() {
                    let mut d = d.clone();
                    d.insert(name.to_string(), DefineValue::Int(v));
                    let sep = if label.is_empty() { "" } else { "," };
                    next.push((format!("{label}{sep}{name}={v}"), d));
                }
            }
            points = next;
        }
        Space::from_defines(&points)
    }

    pub fn len(&self) -> usize {
        self.coords.len()
    }

    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }

    pub fn dims(&self) -> &[Dim] {
        &self.dims
    }

    pub fn label(&self, point: usize) -> &str {
        &self.labels[point]
    }

    /// Value index per dimension.
    pub fn coords(&self, point: usize) -> &[usize] {
        &self.coords[point]
    }

    /// The integer value of `dim` at `point` (None when it is not an
    /// integer or the dimension does not exist).
    pub fn int_value(&self, point: usize, dim: &str) -> Option<i64> {
        let d = self.dims.iter().position(|x| x.name == dim)?;
        match &self.dims[d].values[self.coords[point][d]] {
            Some(DefineValue::Int(v)) => Some(*v),
            _ => None,
        }
    }

    /// The point with exactly these coordinates, if the space lists it.
    pub fn find(&self, coords: &[usize]) -> Option<usize> {
        self.index.get(coords).copied()
    }

    /// Feature vector: an ordinal dimension's rank scaled to [0, 1]; a
    /// categorical one as a one-hot block scaled so that two different
    /// values are at distance 1, like the two ends of an ordinal axis.
    pub fn features(&self, point: usize) -> &[f64] {
        &self.features[point]
    }

    fn features_of(&self, c: &[usize]) -> Vec<f64> {
        let mut f = Vec::new();
        for (dim, &i) in self.dims.iter().zip(c) {
            match dim.kind {
                DimKind::Ordinal => f.push(i as f64 / (dim.values.len() - 1) as f64),
                DimKind::Categorical => {
                    f.extend((0..dim.values.len()).map(|j| {
                        if j == i {
                            std::f64::consts::FRAC_1_SQRT_2
                        } else {
                            0.0
                        }
                    }));
                }
            }
        }
        f
    }

    /// Squared distance between coordinate vectors (they need not be listed
    /// points), in feature units.
    pub fn coord_distance2(&self, a: &[usize], b: &[usize]) -> f64 {
        self.dims
            .iter()
            .zip(a.iter().zip(b))
            .map(|(dim, (&x, &y))| match dim.kind {
                DimKind::Ordinal => {
                    let d = (x as f64 - y as f64) / (dim.values.len() - 1) as f64;
                    d * d
                }
                DimKind::Categorical => f64::from(u8::from(x != y)),
            })
            .sum()
    }
}

/// Sorted distinct values 0, 1, .., n-1 with n >= 3: the numbering of a
/// list of modes rather than a magnitude (two values are an ordinal and a
/// categorical axis alike).
fn is_enumeration(sorted: &[i64]) -> bool {
    sorted.len() >= 3 && sorted.iter().enumerate().all(|(i, &v)| v == i as i64)
}

/// Parses canonical defines (`A=1 B=Q8_0`, as result rows store them).
pub fn parse_canonical(s: &str) -> Defines {
    s.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| {
            let val = v
                .parse::<i64>()
                .map(DefineValue::Int)
                .unwrap_or_else(|_| DefineValue::Str(v.to_string()));
            (k.to_string(), val)
        })
        .collect()
}
