//! A family's runnable instance of one (defines, problem): device inputs,
//! the CPU reference and the launch sequence, shared by `check_variant` and
//! `time_variant`.

use crate::gpu::{DeviceBuffer, Gpu, GpuError, Module};
use crate::verdict::{CheckReport, Contract, Tolerance, POISON_BITS};
use serde::{Deserialize, Serialize};

/// What the ops count of a call measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpKind {
    Flop,
    IntOp,
}

pub trait Workload {
    /// Bytes of one copy of the inputs rotated in the DRAM regime (the
    /// weights); 0 when nothing is rotated.
    fn weight_bytes(&self) -> u64;
    /// Makes `n` weight copies in total (copy 0 is the original).
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError>;
    fn weight_copies(&self) -> usize;
    /// Enqueues one call on the GPU's stream using weight copy `copy`.
    fn launch(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError>;
    /// Whether `launch` initialises the outputs before the kernel runs
    /// (kernels that accumulate into them, e.g. split-K): the check then
    /// runs `launch_kernel_only` on poisoned outputs to find words the
    /// kernel never touches, which the initialisation would hide.
    fn accumulates(&self) -> bool {
        false
    }
    /// `launch` without the output initialisation (the same as `launch`
    /// for workloads that do not accumulate).
    fn launch_kernel_only(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        self.launch(gpu, m, copy)
    }
    /// Writes the poison pattern over every output.
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError>;
    /// Downloads the outputs and judges them.
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError>;
    /// The outputs as raw words (for the run-to-run determinism check).
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError>;
    /// Bytes a call must move at least (weights once, activations, outputs).
    fn bytes_per_call(&self) -> u64;
    /// 2*m*n*k for matmuls.
    fn ops_per_call(&self) -> u64;
    fn op_kind(&self) -> OpKind;
}

/// Weight planes and their copies for DRAM-regime rotation.
pub(crate) struct WeightSet {
    /// copies[c][plane]
    pub copies: Vec<Vec<DeviceBuffer>>,
}

impl WeightSet {
    pub fn new(planes: Vec<DeviceBuffer>) -> WeightSet {
        WeightSet {
            copies: vec![planes],
        }
    }
    pub fn bytes(&self) -> u64 {
        self.copies[0].iter().map(|b| b.bytes() as u64).sum()
    }
    pub fn set_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        let n = n.max(1);
        self.copies.truncate(n);
        while self.copies.len() < n {
            let mut planes = Vec::new();
            for src in &self.copies[0] {
                let b = gpu.alloc(src.bytes())?;
                gpu.copy(&b, src)?;
                planes.push(b);
            }
            self.copies.push(planes);
        }
        gpu.synchronize()
    }
    pub fn get(&self, copy: usize) -> &[DeviceBuffer] {
        &self.copies[copy % self.copies.len()]
    }
}

pub(crate) fn poison(gpu: &Gpu, bufs: &[&DeviceBuffer]) -> Result<(), GpuError> {
    for b in bufs {
        gpu.fill_u32(b, POISON_BITS)?;
    }
    Ok(())
}
