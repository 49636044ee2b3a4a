//! The check's workload: one stage launched on the chosen experts, its
//! outputs against the reference (and the replay), and with COUNT_BYTES
//! the bytes each expert had read.

use super::Stage;
use crate::bind::moe::{ExpertWeights, MoeDownArgs, MoeGateUpArgs};
use crate::bind::NULL;
use crate::device::LaunchGeometry;
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::problem::MoeProblem;
use crate::verdict::{compare, CheckReport, Contract, Tolerance};
use crate::workload::{poison, OpKind, WeightSet, Workload};

pub(super) struct MoeGemvWorkload {
    pub(super) weights: WeightSet,
    pub(super) act: DeviceBuffer,
    pub(super) ids: DeviceBuffer,
    pub(super) route_weights: DeviceBuffer,
    pub(super) out: DeviceBuffer,
    pub(super) count: DeviceBuffer,
    pub(super) count_bytes: bool,
    /// Bytes each expert's rows hold (0 for the unchosen).
    pub(super) expected: Vec<u64>,
    pub(super) stage: Stage,
    /// GATE_UP writes h as split records (H_RECORDS=1).
    pub(super) h_records: bool,
    pub(super) p: MoeProblem,
    pub(super) geo: LaunchGeometry,
    pub(super) reference: crate::families::RefFn,
    pub(super) bytes: u64,
    pub(super) ops: u64,
}

impl MoeGemvWorkload {
    fn kargs(&self, copy: usize) -> Vec<KArg> {
        let planes = self.weights.get(copy);
        let w = ExpertWeights {
            q: planes[0].ptr(),
            d: planes.get(1).map_or(NULL, |b| b.ptr()),
        };
        let count = if self.count_bytes {
            self.count.ptr()
        } else {
            NULL
        };
        let p = &self.p;
        match self.stage {
            Stage::GateUp => MoeGateUpArgs {
                w,
                x: self.act.ptr(),
                ids: self.ids.ptr(),
                h: self.out.ptr(),
                count,
                d: p.d_model,
                ffn: p.ffn,
                n_experts: p.experts,
                n_used: p.used,
            }
            .kargs(),
            Stage::Down => MoeDownArgs {
                w,
                h: self.act.ptr(),
                ids: self.ids.ptr(),
                weights: self.route_weights.ptr(),
                y: self.out.ptr(),
                count,
                d: p.d_model,
                ffn: p.ffn,
                n_experts: p.experts,
                n_used: p.used,
            }
            .kargs(),
        }
    }
}

impl Workload for MoeGemvWorkload {
    fn weight_bytes(&self) -> u64 {
        self.weights.bytes()
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.weights.set_copies(gpu, n)
    }
    fn weight_copies(&self) -> usize {
        self.weights.copies.len()
    }
    fn launch(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        if self.count_bytes {
            gpu.fill_u32(&self.count, 0)?;
        }
        gpu.launch(m, &self.geo, &self.kargs(copy))
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.out])
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let out: Vec<f32> = if self.h_records {
            let n = self.p.tokens * self.p.used * self.p.ffn;
            crate::families::download_split_values(gpu, &self.out, n)?
        } else {
            gpu.download(&self.out)?
        };
        let (reference, replay) = (self.reference)();
        let mut rep = compare(&out, &reference, replay.as_deref(), contract, tol);
        if self.count_bytes {
            let got: Vec<u64> = gpu.download(&self.count)?;
            if let Some(msg) = count_mismatch(&got, &self.expected) {
                rep.passed = false;
                rep.detail = format!("{}; {msg}", rep.detail);
            } else {
                rep.detail = format!(
                    "{}; bytes read: {} chosen experts, {} bytes, each once",
                    rep.detail,
                    self.expected.iter().filter(|&&b| b > 0).count(),
                    self.expected.iter().sum::<u64>()
                );
            }
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v: Vec<u32> = gpu.download(&self.out)?;
        if self.count_bytes {
            v.extend(gpu.download::<u32>(&self.count)?);
        }
        Ok(v)
    }
    fn bytes_per_call(&self) -> u64 {
        self.bytes
    }
    fn ops_per_call(&self) -> u64 {
        self.ops
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

/// Why per-expert byte counts differ from the expected ones (None: equal).
pub(crate) fn count_mismatch(got: &[u64], expected: &[u64]) -> Option<String> {
    let bad: Vec<String> = got
        .iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (g, w))| g != w)
        .take(4)
        .map(|(e, (g, w))| format!("expert {e}: {g} bytes read, {w} expected"))
        .collect();
    if bad.is_empty() && got.len() == expected.len() {
        None
    } else {
        Some(format!(
            "per-expert bytes read differ ({}{})",
            bad.join(", "),
            if got.len() != expected.len() {
                format!("; {} counters for {} experts", got.len(), expected.len())
            } else {
                String::new()
            }
        ))
    }
}
