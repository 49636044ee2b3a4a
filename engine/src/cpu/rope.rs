//! NeoX (half-split) RoPE with per-pair frequency factors.
//!
//! Pair `i` is `(i, i + dims/2)` for `i < dims/2`; dims past `dims` pass
//! through. Angle `θ_i(pos) = pos · base^(−2i/dims) / factor_i`, computed in
//! f64 (as the oracle does), cos/sin rounded to f32 once per position and
//! shared by every head and every layer of the same kind.
//!
//! Gemma 4 full layers use `dims = 512` with factors `[1]*64 + [1e30]*192`
//! (spec §3.4): pairs `(i, i+256)` rotate for `i < 64` at `1e6^(−2i/512)`
//! and the factor 1e30 makes every other angle ~1e-30·pos, i.e. an exact
//! pass-through at f32 precision.

use crate::config::RopeConfig;

/// Inverse frequencies of one layer kind.
#[derive(Clone, Debug)]
pub struct RopeFreqs {
    /// Rotated width (`pairs = dims / 2`).
    pub dims: usize,
    /// `base^(−2i/dims) / factor_i`, i < dims/2.
    pub inv_freq: Vec<f64>,
}

impl RopeFreqs {
    pub fn new(cfg: &RopeConfig) -> RopeFreqs {
        let half = cfg.dims / 2;
        let inv_freq = (0..half)
            .map(|i| {
                let f = (cfg.freq_base as f64).powf(-2.0 * i as f64 / cfg.dims as f64);
                let factor = cfg
                    .freq_factors
                    .as_ref()
                    .and_then(|ff| ff.get(i))
                    .copied()
                    .unwrap_or(1.0) as f64;
                f / factor
            })
            .collect();
        RopeFreqs {
            dims: cfg.dims,
            inv_freq,
        }
    }

    pub fn half(&self) -> usize {
        self.inv_freq.len()
    }

    /// Write the cos/sin table of position `pos` (`half()` entries each).
    pub fn fill(&self, pos: usize, cos: &mut [f32], sin: &mut [f32]) {
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let a = pos as f64 * f;
            *c = a.cos() as f32;
            *s = a.sin() as f32;
        }
    }
}

/// Rotate one head in place with a position's cos/sin table.
#[inline]
pub fn apply(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = cos.len();
    debug_assert!(2 * half <= head.len());
    let (lo, hi) = head.split_at_mut(half);
    for i in 0..half {
        let (x0, x1) = (lo[i], hi[i]);
        lo[i] = x0 * cos[i] - x1 * sin[i];
        hi[i] = x0 * sin[i] + x1 * cos[i];
    }
}
