//! `gemm_wgmma`: prefill GEMM on Hopper's warpgroup MMA (sm_90a). Same
//! function, operands and contract as `gemm_dq` (weights dequantized to
//! f16/bf16 in registers, activations converted once by the shared pre-pass),
//! but the tensor-core instruction is `wgmma.mma_async` with the activation
//! tile read from shared memory through a descriptor. See
//! kernels/cuda/gemm_wgmma.cu.

use super::gemm_dq::{dq_tolerance, dq_workload, is_bf16};
use super::tiles::{bkw, gemm_wtype, pad16, scale_words};
use crate::compile::Arch;
use crate::defines::{defines, int_in, int_range, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{matmul_of, Problem};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

pub struct GemmWgmma;

/// The one architecture whose arch-specific features (`sm_90a`) the kernel uses.
pub const WGMMA_ARCH: Arch = Arch(90);

/// Shared memory per pipeline stage (the kernel's STAGE_BYTES): the swizzled
/// activation tile, padded weight rows and, per row, the two 32-element
/// groups' `scw` scale or side words, rounded up to the 1024-byte swizzle
/// alignment.
fn stage_bytes(bm: usize, bn: usize, bkw: usize, scw: usize) -> usize {
    (bm * 128 + bn * pad16(bkw) + bn * 8 * scw).div_ceil(1024) * 1024
}

impl Family for GemmWgmma {
    fn name(&self) -> &'static str {
        "gemm_wgmma"
    }
    fn entry(&self) -> &'static str {
        "gemm_wgmma"
    }
    fn source_file(&self) -> &'static str {
        "gemm_wgmma.cu"
    }
    fn arch_specific(&self) -> Option<Arch> {
        Some(WGMMA_ARCH)
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("BM", 256i64),
            ("WG", 2),
            ("MW", 1),
            ("STAGES", 4),
            ("KSPLIT", 1),
        ]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d.insert("DQ_TYPE".into(), DefineValue::Str("F16".into()));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Approx
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        dq_tolerance(d, p)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p)?;
        let wt = gemm_wtype(d, mp)?;
        is_bf16(d)?;
        if lim.arch != WGMMA_ARCH {
            return Err(format!(
                "wgmma needs {WGMMA_ARCH}a (Hopper); the target is {}",
                lim.arch
            ));
        }
        let bm = int_in(d, "BM", &[64, 128, 192, 256])? as usize;
        let wg = int_range(d, "WG", 1, 3)? as usize;
        let mw = int_range(d, "MW", 1, 2)? as usize;
        let stages = int_range(d, "STAGES", 3, 6)? as usize;
        let ksplit = int_in(d, "KSPLIT", &[1, 2])? as u32;
        let acc = mw * bm / 2;
        if acc > 128 {
            return Err(format!(
                "MW*BM/2 = {acc} fp32 accumulators per thread (> 128) would not fit in registers"
            ));
        }
        let bn = 64 * mw * wg;
        let smem = 1024 + stages * stage_bytes(bm, bn, bkw(wt, 64), scale_words(wt));
        if smem > lim.max_smem_per_block as usize {
            return Err(format!(
                "needs {smem} bytes of shared memory, the {} limit is {}",
                lim.arch, lim.max_smem_per_block
            ));
        }
        let gy = mp.n.div_ceil(bn);
        if gy > 65535 {
            return Err(format!("{gy} feature tiles exceed grid.y's 65535"));
        }
        Ok(LaunchGeometry {
            kernel: "gemm_wgmma".into(),
            grid: (mp.m.div_ceil(bm) as u32, gy as u32, ksplit),
            block: ((128 * wg) as u32, 1, 1),
            dyn_smem: smem as u32,
        })
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        // Split-K's zeroing of y is part of the binding.
        dq_workload(self, gpu, d, p, geo, seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_bytes_match_the_kernel_formula() {
        // BM=256, 2 warpgroups x 1 block: 32768 + 128*80 + 1024 -> 44032.
        assert_eq!(stage_bytes(256, 128, 64, 1), 44032);
        // Q4_0 rows are 32 bytes, padded to 48.
        assert_eq!(
            stage_bytes(128, 128, 32, 1),
            (16384 + 128 * 48 + 1024usize).div_ceil(1024) * 1024
        );
    }

    #[test]
    fn other_archs_are_rejected_with_a_reason() {
        let f = GemmWgmma;
        let d = f.default_defines(GgmlType::Q8_0);
        let p = Problem::matmul(256, 1024, 2560, GgmlType::Q8_0);
        let e = f
            .validate(&d, &p, &DeviceLimits::for_arch(Arch(80)))
            .unwrap_err();
        assert!(e.contains("sm_90a"), "{e}");
        let g = f
            .validate(&d, &p, &DeviceLimits::for_arch(Arch(90)))
            .unwrap();
        assert_eq!(g.block.0, 256);
        assert_eq!(g.grid, (1, 8, 1));
    }

    /// Every weight type takes every tile the accumulator rule allows,
    /// the tightest register budgets included (three warpgroups: 168
    /// registers; MW=2 next to 128 accumulators: 255). Whether a type's
    /// dequantization fits them is the compile gate's question
    /// (`forbid_spills` in variants/gemm_wgmma.toml, the compile report), not
    /// a rule of `validate`.
    #[test]
    fn every_type_takes_the_tightest_register_budgets() {
        let f = GemmWgmma;
        let lim = DeviceLimits::for_arch(Arch(90));
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4K,
            GgmlType::Q5K,
            GgmlType::Q6K,
            GgmlType::F16,
            GgmlType::Bf16,
        ] {
            let p = Problem::matmul(256, 1024, 2560, ty);
            for (bm, wg, mw) in [(192i64, 3i64, 1i64), (128, 2, 2)] {
                let mut d = f.default_defines(ty);
                for (k, v) in [("BM", bm), ("WG", wg), ("MW", mw)] {
                    d.insert(k.into(), DefineValue::Int(v));
                }
                let g = f
                    .validate(&d, &p, &lim)
                    .unwrap_or_else(|e| panic!("{ty} BM={bm} WG={wg} MW={mw}: {e}"));
                assert_eq!(g.block.0 as i64, 128 * wg);
            }
            // Past 128 accumulators no type fits.
            let mut d = f.default_defines(ty);
            for (k, v) in [("BM", 256i64), ("MW", 2)] {
                d.insert(k.into(), DefineValue::Int(v));
            }
            let e = f.validate(&d, &p, &lim).expect_err("256 accumulators");
            assert!(e.contains("accumulators per thread"), "{ty}: {e}");
        }
    }
}
