//! RoPE inverse frequencies, one definition for both backends: the CPU
//! forward builds its cos/sin tables from them and the CUDA engine uploads
//! the same f64 values for `qk_norm_rope`.
//!
//! Pair `i` is `(i, i + dims/2)` for `i < dims/2` (NeoX half split);
//! `inv_freq_i = base^(-2i/dims) / factor_i`, in f64. Gemma 4's full layers
//! carry factors `[1]*64 + [1e30]*192` over `dims = 512` (docs/gemma4.md):
//! pairs past the 64th get an angle of ~1e-30 per position, an exact
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
        RopeFreqs {
            dims: cfg.dims,
            inv_freq: gemtune_kernels::oracle::rope_inv_freq(
                cfg.freq_base,
                cfg.dims,
                cfg.freq_factors.as_deref(),
            ),
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
