//! `act_convert`: f32 activations to plain row-major f16/bf16 (the vendor
//! GEMM arm's operand). Bitexact against the CPU round-to-nearest-even
//! conversion. See kernels/cuda/act_convert.cu.

use super::{random_matrix, rng_for};
use crate::bind::rows::ActConvertArgs;
use crate::defines::{defines, get_str, int_range, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, Module};
use crate::kernel_family::Family;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::blocks::{f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::verdict::{CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, Workload};

pub struct ActConvert;

/// The CPU rule: f32 to the OUT type's bits, round to nearest even.
pub fn convert_replay(x: &[f32], bf16: bool) -> Vec<u16> {
    x.iter()
        .map(|&v| if bf16 { f32_to_bf16(v) } else { f32_to_f16(v) })
        .collect()
}

fn is_bf16(d: &Defines) -> Result<bool, String> {
    match get_str(d, "OUT")?.as_str() {
        "BF16" => Ok(true),
        "F16" => Ok(false),
        o => Err(format!("OUT={o} is not F16 or BF16")),
    }
}

impl Family for ActConvert {
    fn name(&self) -> &'static str {
        "act_convert"
    }
    fn entry(&self) -> &'static str {
        "act_convert"
    }
    fn source_file(&self) -> &'static str {
        "act_convert.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([("THREADS", 256i64)]);
        d.insert("OUT".into(), "BF16".into());
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Bitexact
    }
    fn default_tolerance(&self, _d: &Defines, _p: &Problem) -> Tolerance {
        Tolerance::bitexact()
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let r = rows_of(p)?;
        is_bf16(d)?;
        let threads = int_range(d, "THREADS", 32, lim.max_threads_per_block as i64)?;
        if threads % 32 != 0 {
            return Err(format!("THREADS={threads} is not a multiple of 32"));
        }
        let n = (r.rows * r.width) as u64;
        if n == 0 || n % 2 != 0 {
            return Err(format!(
                "{} x {} values: the count must be positive and even",
                r.rows, r.width
            ));
        }
        let blocks = n.div_ceil(8).div_ceil(threads as u64);
        if blocks > i32::MAX as u64 {
            return Err("problem too large for a 1-D grid".into());
        }
        Ok(LaunchGeometry {
            kernel: "act_convert".into(),
            grid: (blocks as u32, 1, 1),
            block: (threads as u32, 1, 1),
            dyn_smem: 0,
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
        let r = rows_of(p).map_err(GpuError::Rejected)?;
        let bf16 = is_bf16(d).map_err(GpuError::Rejected)?;
        let mut rng = rng_for(self.name(), &[r.rows, r.width], seed);
        // Magnitudes across many binades, so rounding and exponents vary.
        let mut x = random_matrix(&mut rng, r.rows, r.width);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= f32::powi(2.0, (i % 23) as i32 - 11);
        }
        let n = x.len();
        Ok(Box::new(ConvertWorkload {
            x: gpu.upload(&x)?,
            out: gpu.alloc(n * 2)?,
            want: convert_replay(&x, bf16),
            n,
            geo: geo.clone(),
        }))
    }
}

struct ConvertWorkload {
    x: DeviceBuffer,
    out: DeviceBuffer,
    want: Vec<u16>,
    n: usize,
    geo: LaunchGeometry,
}

impl Workload for ConvertWorkload {
    fn weight_bytes(&self) -> u64 {
        0
    }
    fn set_weight_copies(&mut self, _gpu: &Gpu, _n: usize) -> Result<(), GpuError> {
        Ok(())
    }
    fn weight_copies(&self) -> usize {
        1
    }
    fn launch(&self, gpu: &Gpu, m: &Module, _copy: usize) -> Result<(), GpuError> {
        let args = ActConvertArgs {
            x: self.x.ptr(),
            out: self.out.ptr(),
            n: self.n,
        };
        gpu.launch(m, &self.geo, &args.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.out])
    }
    fn evaluate(&self, gpu: &Gpu, _c: Contract, _tol: &Tolerance) -> Result<CheckReport, GpuError> {
        let words: Vec<u32> = gpu.download(&self.out)?;
        let unwritten = words.iter().filter(|&&w| w == POISON_BITS).count();
        let got: Vec<u16> = words
            .iter()
            .flat_map(|w| [(*w & 0xffff) as u16, (*w >> 16) as u16])
            .collect();
        let bad = got.iter().zip(&self.want).filter(|(a, b)| a != b).count();
        Ok(CheckReport::exact(self.n, bad, unwritten))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.out)
    }
    fn bytes_per_call(&self) -> u64 {
        (self.n * 6) as u64
    }
    fn ops_per_call(&self) -> u64 {
        self.n as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::problem::RowsProblem;

    #[test]
    fn replay_rounds_to_nearest_even() {
        // 1 + 2^-8 is halfway between two bf16 values: ties go to even.
        let x = [
            1.0f32 + f32::powi(2.0, -8),
            1.0 + 3.0 * f32::powi(2.0, -8),
            -2.5,
        ];
        let b = convert_replay(&x, true);
        assert_eq!(b, vec![0x3f80, 0x3f82, 0xc020]);
        let h = convert_replay(&[1.0, -0.5], false);
        assert_eq!(h, vec![0x3c00, 0xb800]);
    }

    #[test]
    fn odd_counts_and_bad_outputs_are_rejected() {
        let f = ActConvert;
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = |rows, width| {
            Problem::Rows(RowsProblem {
                rows,
                width,
                dtype: GgmlType::F32,
                aux: 0,
            })
        };
        let d = f.default_defines(GgmlType::F32);
        assert!(f.validate(&d, &p(3, 3), &lim).is_err());
        let g = f.validate(&d, &p(3, 2560), &lim).expect("valid");
        assert_eq!(g.grid.0, (3 * 2560usize).div_ceil(8).div_ceil(256) as u32);
        let mut bad = d.clone();
        bad.insert("OUT".into(), "F8".into());
        assert!(f.validate(&bad, &p(1, 64), &lim).is_err());
        assert!(f
            .validate(&d, &Problem::matmul(1, 8, 32, GgmlType::Q8_0), &lim)
            .is_err());
    }
}
