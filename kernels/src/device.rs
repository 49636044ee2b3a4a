//! The device side of a launch: the architecture a variant is compiled
//! for, the limits `Family::validate` checks it against, and the geometry
//! it returns.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A CUDA compute capability as an SM number: 80 (A100), 89 (Ada), 90 (H100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arch(pub u32);

impl Arch {
    /// Shared memory a block may opt in to on this architecture, in bytes;
    /// used by `validate` when no GPU is present.
    pub fn max_smem_optin(self) -> u32 {
        match self.0 {
            90.. => 227 * 1024,
            80 | 87 => 163 * 1024,
            86 | 89 => 99 * 1024,
            75 => 64 * 1024,
            _ => 48 * 1024,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.0)
    }
}

/// Parses `sm_90`, `90` or the arch-specific form `sm_90a`. The `a` form
/// names the same target here: a family that needs arch-specific features
/// (`gemm_wgmma`) always compiles for its `a` target, every other family
/// for the plain one, so `sm_90a` and `sm_90` select the same compiles.
/// Whether NVRTC can target it is `supported_archs`'s business.
impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.strip_prefix("sm_").unwrap_or(s);
        let digits = digits
            .strip_suffix('a')
            .or_else(|| digits.strip_suffix('f'))
            .unwrap_or(digits);
        match digits.parse::<u32>() {
            Ok(v) if (10..=999).contains(&v) => Ok(Arch(v)),
            _ => Err(format!("'{s}' is not an SM architecture like sm_90")),
        }
    }
}

/// What `validate` checks a variant against. From `Gpu::limits()` on a GPU,
/// or `DeviceLimits::for_arch` for compile-only runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub arch: Arch,
    /// Largest dynamic + static shared memory one block may use (opt-in).
    pub max_smem_per_block: u32,
    pub max_threads_per_block: u32,
    pub sm_count: u32,
    pub l2_bytes: u64,
}

impl DeviceLimits {
    /// Nominal limits of an architecture (no GPU needed).
    pub fn for_arch(arch: Arch) -> DeviceLimits {
        let (sm, l2) = match arch.0 {
            90.. => (132, 50 << 20),
            89 => (128, 72 << 20),
            80 => (108, 40 << 20),
            _ => (80, 6 << 20),
        };
        DeviceLimits {
            arch,
            max_smem_per_block: arch.max_smem_optin(),
            max_threads_per_block: 1024,
            sm_count: sm,
            l2_bytes: l2,
        }
    }
}

/// How to launch a variant on a problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchGeometry {
    /// The `extern "C"` function to launch (a family may instantiate several
    /// in one module, e.g. one per token count).
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Dynamic shared memory bytes.
    pub dyn_smem: u32,
}

impl LaunchGeometry {
    pub fn threads(&self) -> u32 {
        self.block.0 * self.block.1 * self.block.2
    }
}

/// How a family's kernel is enqueued beyond its geometry: whether it waits
/// for the launch before it by itself, and what must follow it. The family
/// decides it from its defines (`Family::launch_sequence`), and the check
/// workloads and the engine's launches (`bind`) both follow it, so no
/// launch decision depends on a family or entry name.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LaunchSequence {
    /// One launch in stream order.
    #[default]
    Single,
    /// Decode attention: the kernel is a programmatic dependent of the
    /// launch before it (`Gpu::launch_dependent`: PDL on sm_90, stream
    /// order below) and reads the position from device memory. With
    /// `combine`, its split-KV partials are merged by the module's
    /// `attn_combine`, launched as a programmatic dependent of it.
    Decode { combine: bool },
}
