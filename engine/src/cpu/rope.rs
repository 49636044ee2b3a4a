//! NeoX (half-split) RoPE rotation of the CPU forward.
//!
//! Angles come from `crate::rope::RopeFreqs` (the frequencies both backends
//! share): `θ_i(pos) = pos · inv_freq_i`, in f64, cos/sin rounded to f32
//! once per position and shared by every head and every layer of the same
//! kind. Dims past `dims` pass through.

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
