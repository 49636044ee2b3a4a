//! Random search: the points in one seeded shuffle, without replacement.

use super::{evaluated, Space, Strategy, Trial};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub struct Random {
    seed: u64,
    /// The shuffled order, drawn on the first call (the space is not known
    /// before).
    order: Option<Vec<usize>>,
}

impl Random {
    pub fn new(seed: u64) -> Random {
        Random { seed, order: None }
    }
}

impl Strategy for Random {
    fn next(&mut self, space: &Space, history: &[Trial]) -> Option<usize> {
        let seed = self.seed;
        let order = self.order.get_or_insert_with(|| {
            let mut o: Vec<usize> = (0..space.len()).collect();
            o.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
            o
        });
        let done = evaluated(space, history);
        order.iter().copied().find(|&p| !done[p])
    }
}
