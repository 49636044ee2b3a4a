//! A steady-state genetic algorithm over the defines.
//!
//! The first `population` points are drawn at random. After that, each
//! proposal breeds one child: two parents, each the better of two drawn
//! from the `population` best evaluated points (failures rank last); each
//! define taken from either parent with even odds (uniform crossover); each
//! define moved with probability 1/dims (an integer one step up or down its
//! sorted values, any other to a random value), at least one when the child
//! would repeat an evaluated point. The child is then mapped onto the
//! nearest unevaluated point (the space is a union of sweeps, not one
//! product, so the combination may not exist). A fraction `explore` of the
//! proposals are random unevaluated points, so the search does not stay in
//! one basin.

use super::{evaluated, Space, Strategy, Trial};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub struct Evolutionary {
    rng: ChaCha8Rng,
    /// Population size; 0 chooses from the space (an eighth of it, 4..16).
    pub population: usize,
    pub explore: f64,
}

impl Evolutionary {
    pub fn new(seed: u64) -> Evolutionary {
        Evolutionary {
            rng: ChaCha8Rng::seed_from_u64(seed),
            population: 0,
            explore: 0.1,
        }
    }

    fn population_for(&self, space: &Space) -> usize {
        if self.population > 0 {
            self.population
        } else {
            (space.len() / 8).clamp(4, 16)
        }
    }

    /// The better (lower rank) of two ranks drawn from 0..n.
    fn tournament(&mut self, n: usize) -> usize {
        let a = self.rng.random_range(0..n);
        let b = self.rng.random_range(0..n);
        a.min(b)
    }

    fn mutate_dim(&mut self, space: &Space, child: &mut [usize], d: usize) {
        let dim = &space.dims()[d];
        let k = dim.values.len();
        child[d] = match dim.kind {
            super::DimKind::Ordinal => {
                let up = self.rng.random_bool(0.5);
                match (child[d], up) {
                    (0, _) => 1,
                    (i, _) if i + 1 == k => i - 1,
                    (i, true) => i + 1,
                    (i, false) => i - 1,
                }
            }
            super::DimKind::Categorical => {
                let j = self.rng.random_range(0..k - 1);
                if j >= child[d] {
                    j + 1
                } else {
                    j
                }
            }
        };
    }

    /// The unevaluated point nearest to `coords` (ties: a random one).
    fn nearest(&mut self, space: &Space, coords: &[usize], done: &[bool]) -> Option<usize> {
        let mut best: Vec<usize> = Vec::new();
        let mut best_d = f64::INFINITY;
        for p in (0..space.len()).filter(|&p| !done[p]) {
            let d = space.coord_distance2(coords, space.coords(p));
            if d < best_d - 1e-12 {
                best_d = d;
                best.clear();
                best.push(p);
            } else if d <= best_d + 1e-12 {
                best.push(p);
            }
        }
        match best.len() {
            0 => None,
            n => Some(best[self.rng.random_range(0..n)]),
        }
    }
}

impl Strategy for Evolutionary {
    fn next(&mut self, space: &Space, history: &[Trial]) -> Option<usize> {
        let done = evaluated(space, history);
        let open: Vec<usize> = (0..space.len()).filter(|&p| !done[p]).collect();
        if open.is_empty() {
            return None;
        }
        let pop = self.population_for(space);
        let dims = space.dims().len();
        if history.len() < pop || dims == 0 || self.rng.random_bool(self.explore) {
            return Some(open[self.rng.random_range(0..open.len())]);
        }
        // Rank the evaluated points: by value, failures last, then by order.
        let mut ranked: Vec<(usize, &Trial)> = history.iter().enumerate().collect();
        ranked.sort_by(|(i, a), (j, b)| {
            let va = a.value.unwrap_or(f64::INFINITY);
            let vb = b.value.unwrap_or(f64::INFINITY);
            va.total_cmp(&vb).then(i.cmp(j))
        });
        let n = pop.min(ranked.len());
        let a = space.coords(ranked[self.tournament(n)].1.point).to_vec();
        let b = space.coords(ranked[self.tournament(n)].1.point).to_vec();
        let mut child: Vec<usize> = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| if self.rng.random_bool(0.5) { x } else { y })
            .collect();
        let rate = 1.0 / dims as f64;
        for d in 0..dims {
            if self.rng.random_bool(rate) {
                self.mutate_dim(space, &mut child, d);
            }
        }
        // A child equal to an evaluated point moves until it is new (or
        // the attempts run out; the nearest open point is taken anyway).
        for _ in 0..4 * dims {
            match space.find(&child) {
                Some(p) if done[p] => {
                    let d = self.rng.random_range(0..dims);
                    self.mutate_dim(space, &mut child, d);
                }
                _ => break,
            }
        }
        self.nearest(space, &child, &done)
    }
}
