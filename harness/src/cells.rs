//! The work cells of a sweep and their deterministic split into shards.
//!
//! A work cell is one (variant, shape) of a family that the plan accepted:
//! rejected and duplicate points are not work (every run lists them from
//! the plan), so shards are balanced on what is compiled, checked and
//! timed. The list is in plan order (family, then variant, then shape) and
//! depends only on the specs, the shapes and the device limits, never on
//! cache state or timing; a search strategy may consume it in any order.
//!
//! Shards split the cells by define set: every cell that runs one resolved
//! define set (one compile) lands in the same shard, so no two shards
//! compile the same kernel. The define sets are dealt largest first to the
//! shard holding the fewest cells (ties to the lowest shard), which keeps
//! the shards within one define set's cells of each other.

use crate::checker::FamilyJob;
use crate::spec::Cell;
use gemtune_kernels::defines::canonical;
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use thiserror::Error;

/// Names one cell across processes and runs: what a worker is handed, what
/// the results log and `merge` key rows on.
#[derive(
    Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct CellId {
    pub family: String,
    pub variant: String,
    pub shape: String,
}

impl fmt::Display for CellId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.family, self.variant, self.shape)
    }
}

/// One accepted (variant, shape) cell, with where it sits in the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkCell {
    pub id: CellId,
    /// Index of the family job, of the point in the job, of the shape in
    /// the job, and of the cell in the job's plan.
    pub job: usize,
    pub point: usize,
    pub shape: usize,
    pub plan_index: usize,
    /// Canonical resolved defines (shape-bound ones included): one compile.
    pub defines: String,
}

/// The accepted cells of every job's plan, in plan order.
pub fn work_cells(jobs: &[FamilyJob], planned: &[Vec<Cell>]) -> Vec<WorkCell> {
    let mut out = Vec::new();
    for (ji, (job, cells)) in jobs.iter().zip(planned).enumerate() {
        for (ci, c) in cells.iter().enumerate() {
            if c.outcome.is_err() {
                continue;
            }
            out.push(WorkCell {
                id: CellId {
                    family: job.family.name().to_string(),
                    variant: job.points[c.point].id.clone(),
                    shape: job.shapes[c.shape].name.clone(),
                },
                job: ji,
                point: c.point,
                shape: c.shape,
                plan_index: ci,
                defines: canonical(&c.defines),
            });
        }
    }
    out
}

#[derive(Debug, Error, PartialEq)]
pub enum ShardError {
    #[error("--shard {0}: expected I/N with 1 <= I <= N (shards count from 1, e.g. 1/4 .. 4/4)")]
    Syntax(String),
}

/// `--shard I/N`: the I-th of N shards, counted from 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl FromStr for Shard {
    type Err = ShardError;
    fn from_str(s: &str) -> Result<Shard, ShardError> {
        let bad = || ShardError::Syntax(s.to_string());
        let (i, n) = s.trim().split_once('/').ok_or_else(bad)?;
        let index: usize = i.trim().parse().map_err(|_| bad())?;
        let count: usize = n.trim().parse().map_err(|_| bad())?;
        if index == 0 || count == 0 || index > count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// clap value parser of `--shard`.
pub fn parse_shard(s: &str) -> Result<Shard, String> {
    s.parse().map_err(|e: ShardError| e.to_string())
}

/// The shard (1-based) of every cell, in the cells' order.
pub fn shard_of(cells: &[WorkCell], count: usize) -> Vec<usize> {
    let count = count.max(1);
    // Define sets in order of first appearance, with their cells.
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: BTreeMap<(usize, &str), usize> = BTreeMap::new();
    for (i, c) in cells.iter().enumerate() {
        let g = *group_of
            .entry((c.job, c.defines.as_str()))
            .or_insert_with(|| {
                groups.push(Vec::new());
                groups.len() - 1
            });
        groups[g].push(i);
    }
    let mut order: Vec<usize> = (0..groups.len()).collect();
    // Stable: equal sizes keep their plan order.
    order.sort_by_key(|&g| std::cmp::Reverse(groups[g].len()));
    let mut load = vec![0usize; count];
    let mut out = vec![0usize; cells.len()];
    for g in order {
        let (s, _) = load
            .iter()
            .enumerate()
            .min_by_key(|&(s, &l)| (l, s))
            .unwrap_or((0, &0));
        load[s] += groups[g].len();
        for &i in &groups[g] {
            out[i] = s + 1;
        }
    }
    out
}

/// The cells of `shard` (all of them without one), in plan order.
pub fn select(cells: Vec<WorkCell>, shard: Option<Shard>) -> Vec<WorkCell> {
    let Some(sh) = shard else { return cells };
    let of = shard_of(&cells, sh.count);
    cells
        .into_iter()
        .zip(of)
        .filter(|(_, s)| *s == sh.index)
        .map(|(c, _)| c)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(job: usize, point: usize, shape: usize, defines: &str) -> WorkCell {
        WorkCell {
            id: CellId {
                family: format!("f{job}"),
                variant: format!("v{point}"),
                shape: format!("s{shape}"),
            },
            job,
            point,
            shape,
            plan_index: point * 100 + shape,
            defines: defines.to_string(),
        }
    }

    #[test]
    fn shard_syntax() {
        assert_eq!("2/4".parse::<Shard>(), Ok(Shard { index: 2, count: 4 }));
        for bad in ["0/4", "5/4", "1/0", "1", "a/b", "1/2/3", ""] {
            assert!(bad.parse::<Shard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn define_sets_stay_together_and_shards_balance() {
        // Four define sets of 3, 3, 2 and 1 cells.
        let mut cells = Vec::new();
        for (p, (n, d)) in [(3, "A"), (3, "B"), (2, "C"), (1, "D")].iter().enumerate() {
            for s in 0..*n {
                cells.push(cell(0, p, s, d));
            }
        }
        let of = shard_of(&cells, 2);
        for d in ["A", "B", "C", "D"] {
            let shards: std::collections::BTreeSet<usize> = cells
                .iter()
                .zip(&of)
                .filter(|(c, _)| c.defines == d)
                .map(|(_, s)| *s)
                .collect();
            assert_eq!(shards.len(), 1, "define set {d} split over {shards:?}");
        }
        let count = |s: usize| of.iter().filter(|&&x| x == s).count();
        assert_eq!((count(1), count(2)), (5, 4));
        // More shards than define sets: the extra shards are empty.
        let of = shard_of(&cells, 6);
        assert_eq!(of.iter().filter(|&&x| x > 4).count(), 0);
    }
}
