//! The kernel-family abstraction: one `.cu` file, one Rust description that
//! validates defines against a problem, computes the launch geometry and
//! builds a checkable, timeable workload. The registry of families is
//! `family::families`.

use crate::compile::{CompileSource, SourceSpec};
use crate::defines::Defines;
use crate::device::{Arch, DeviceLimits, LaunchGeometry, LaunchSequence};
use crate::gpu::{Gpu, GpuError};
use crate::problem::{Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::source;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

/// A kernel family. Implementations live in `families::*`.
pub trait Family: Sync {
    fn name(&self) -> &'static str;
    /// Base entry name; `LaunchGeometry::kernel` names the exact function.
    fn entry(&self) -> &'static str;
    /// File under `kernels/cuda/`.
    fn source_file(&self) -> &'static str;
    /// The macro names listed in the source's `Defines:` header block.
    fn declared_defines(&self) -> Vec<String> {
        source::source(self.source_file())
            .map(source::header_defines)
            .unwrap_or_default()
    }
    /// The architecture whose arch-specific feature set (`sm_XXa`, e.g.
    /// Hopper's wgmma) the source needs: it compiles for that target only,
    /// and `validate` rejects every other device. `None`: portable source.
    fn arch_specific(&self) -> Option<Arch> {
        None
    }
    /// The arch-specific target one define set needs: the family's, or
    /// (for a family whose variants mix portable and arch-specific
    /// algorithms) the one this variant's algorithm needs.
    fn arch_specific_for(&self, _d: &Defines) -> Option<Arch> {
        self.arch_specific()
    }
    /// The kind of shape the family runs on.
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Matmul
    }
    /// Defines of the family's default (baseline-quality) variant for `wtype`.
    fn default_defines(&self, wtype: GgmlType) -> Defines;
    /// The contract a variant with these defines is held to.
    fn contract(&self, d: &Defines) -> Contract;
    /// A tolerance derived from the contract and the problem (the accumulation
    /// length K); spec files may override it.
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance;
    /// Rejects impossible points with a reason, else returns the geometry.
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String>;
    /// How a variant with these defines is enqueued (`LaunchSequence`).
    fn launch_sequence(&self, _d: &Defines) -> Result<LaunchSequence, String> {
        Ok(LaunchSequence::Single)
    }
    /// Seeded inputs on the GPU, the CPU reference, and the launch sequence.
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError>;
}

/// Every family compiles through `compile::compile`.
impl<F: Family + ?Sized> CompileSource for F {
    fn source_spec(&self, d: &Defines) -> SourceSpec {
        SourceSpec {
            family: self.name(),
            file: self.source_file(),
            declared: self.declared_defines(),
            arch_specific: self.arch_specific_for(d),
        }
    }
}
