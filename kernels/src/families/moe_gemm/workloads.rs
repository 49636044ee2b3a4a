//! The check's workloads, one per stage: GROUP (the pairs sorted by
//! expert, any order inside a group), COMBINE (the weighted sum per token)
//! and the GEMM stages (GATE_UP, DOWN) on their grouped tiles.

use super::Stage;
use crate::bind::moe::{
    ExpertWeights, MoeCombineArgs, MoeGemmDownArgs, MoeGemmGateUpArgs, MoeGroupArgs,
};
use crate::bind::NULL;
use crate::device::LaunchGeometry;
use crate::families::gemv::fp_rms_bound;
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::oracle::MoeGrouping;
use crate::problem::MoeProblem;
use crate::verdict::{compare, CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, WeightSet, Workload};

pub(super) struct GroupOut {
    pub(super) counts: DeviceBuffer,
    pub(super) offsets: DeviceBuffer,
    pub(super) sorted: DeviceBuffer,
    pub(super) tiles: DeviceBuffer,
}

pub(super) struct GroupWorkload {
    pub(super) ids: DeviceBuffer,
    pub(super) out: GroupOut,
    pub(super) want: MoeGrouping,
    pub(super) p: MoeProblem,
    pub(super) bm: usize,
    pub(super) geo: LaunchGeometry,
}

/// The kernel's GROUP outputs with every expert's pairs in ascending order
/// (the order inside a group is free): counts, offsets, sorted (the valid
/// entries), tiles flattened — what the check compares and the
/// determinism check sees.
pub(super) fn canonical_group(
    counts: Vec<i32>,
    offsets: Vec<i32>,
    mut sorted: Vec<i32>,
    tiles: Vec<i32>,
    want: &MoeGrouping,
) -> Vec<i32> {
    let n_valid = want.sorted.len();
    sorted.truncate(n_valid);
    let e = want.counts.len();
    for x in 0..e {
        // The expected segment bounds: a kernel with wrong offsets fails
        // on them, and its segments are compared as they stand.
        let (a, b) = (want.offsets[x] as usize, want.offsets[x + 1] as usize);
        if a <= b && b <= sorted.len() {
            sorted[a..b].sort_unstable();
        }
    }
    let mut v = counts;
    v.extend(offsets);
    v.extend(sorted);
    v.extend(tiles);
    v
}

impl GroupWorkload {
    fn kargs(&self) -> Vec<KArg> {
        MoeGroupArgs {
            ids: self.ids.ptr(),
            counts: self.out.counts.ptr(),
            offsets: self.out.offsets.ptr(),
            sorted: self.out.sorted.ptr(),
            tiles: self.out.tiles.ptr(),
            n_tokens: self.p.tokens,
            n_experts: self.p.experts,
            n_used: self.p.used,
            bm: self.bm,
        }
        .kargs()
    }
    fn canonical(&self, gpu: &Gpu) -> Result<Vec<i32>, GpuError> {
        Ok(canonical_group(
            gpu.download(&self.out.counts)?,
            gpu.download(&self.out.offsets)?,
            gpu.download(&self.out.sorted)?,
            gpu.download(&self.out.tiles)?,
            &self.want,
        ))
    }
}

pub(super) fn want_group(w: &MoeGrouping) -> Vec<i32> {
    let mut v = w.counts.clone();
    v.extend(&w.offsets);
    v.extend(&w.sorted);
    v.extend(w.tiles.iter().flat_map(|t| [t[0], t[1]]));
    v
}

/// Compares GROUP's canonical outputs with the expected ones: the report
/// of a bit-exact comparison, its detail naming the first differing part.
pub(super) fn group_report(got: &[i32], want: &MoeGrouping) -> CheckReport {
    let w = want_group(want);
    let e = want.counts.len();
    let parts = [
        ("counts", 0, e),
        ("offsets", e, 2 * e + 1),
        ("sorted", 2 * e + 1, 2 * e + 1 + want.sorted.len()),
        ("tiles", 2 * e + 1 + want.sorted.len(), w.len()),
    ];
    let bad = got.iter().zip(&w).filter(|(a, b)| a != b).count() + w.len().abs_diff(got.len());
    let unwritten = got.iter().filter(|&&v| v as u32 == POISON_BITS).count();
    let mut rep = CheckReport::exact(w.len(), bad, unwritten);
    let mut why = Vec::new();
    for (name, a, b) in parts {
        let g = got.get(a..b.min(got.len())).unwrap_or(&[]);
        if let Some(i) = g.iter().zip(&w[a..b]).position(|(x, y)| x != y) {
            why.push(format!("{name}[{i}] = {} (want {})", g[i], w[a + i]));
        }
    }
    rep.detail = if why.is_empty() && rep.passed {
        format!(
            "grouping exact: {} valid pairs of {} in {} tiles (BM rows)",
            want.sorted.len(),
            want.counts.len(),
            want.tiles.iter().filter(|t| t[0] >= 0).count()
        )
    } else {
        format!("{}; {}", rep.detail, why.join(", "))
    };
    rep
}

impl Workload for GroupWorkload {
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
        gpu.launch(m, &self.geo, &self.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(
            gpu,
            &[
                &self.out.counts,
                &self.out.offsets,
                &self.out.sorted,
                &self.out.tiles,
            ],
        )
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        _contract: Contract,
        _tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        Ok(group_report(&self.canonical(gpu)?, &self.want))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        Ok(self.canonical(gpu)?.iter().map(|&v| v as u32).collect())
    }
    fn bytes_per_call(&self) -> u64 {
        let pairs = (self.p.tokens * self.p.used) as u64;
        // ids read twice, sorted written, the small tables.
        12 * pairs + (8 * self.want.tiles.len() + 8 * self.p.experts) as u64
    }
    fn ops_per_call(&self) -> u64 {
        (self.p.tokens * self.p.used) as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::IntOp
    }
}

pub(super) struct CombineWorkload {
    pub(super) yp: DeviceBuffer,
    pub(super) ids: DeviceBuffer,
    pub(super) route_w: DeviceBuffer,
    pub(super) y: DeviceBuffer,
    pub(super) replay: Vec<f32>,
    pub(super) reference: Vec<f64>,
    pub(super) p: MoeProblem,
    pub(super) geo: LaunchGeometry,
}

impl CombineWorkload {
    fn kargs(&self) -> Vec<KArg> {
        MoeCombineArgs {
            yp: self.yp.ptr(),
            ids: self.ids.ptr(),
            weights: self.route_w.ptr(),
            y: self.y.ptr(),
            n_tokens: self.p.tokens,
            d: self.p.d_model,
            n_experts: self.p.experts,
            n_used: self.p.used,
        }
        .kargs()
    }
}

impl Workload for CombineWorkload {
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
        gpu.launch(m, &self.geo, &self.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.y])
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let out: Vec<f32> = gpu.download(&self.y)?;
        let replay: Vec<f64> = self.replay.iter().map(|&v| v as f64).collect();
        let mut rep = compare(&out, &self.reference, Some(&replay), contract, tol);
        // The replay is the defined arithmetic; the f64 oracle bounds it.
        let fp = compare(
            &self.replay,
            &self.reference,
            None,
            Contract::Fp,
            &Tolerance::fp(fp_rms_bound(self.p.used)),
        );
        if !fp.passed {
            rep.passed = false;
            rep.detail = format!(
                "{}; the CPU replay is off the f64 oracle: {}",
                rep.detail, fp.detail
            );
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.y)
    }
    fn bytes_per_call(&self) -> u64 {
        let valid = self.replay.len() as u64 / self.p.d_model.max(1) as u64;
        4 * (self.p.tokens * self.p.used * self.p.d_model) as u64
            + 4 * valid * self.p.d_model as u64
    }
    fn ops_per_call(&self) -> u64 {
        2 * (self.p.tokens * self.p.used * self.p.d_model) as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

pub(super) struct GemmWorkload {
    pub(super) weights: WeightSet,
    pub(super) act: DeviceBuffer,
    pub(super) sorted: DeviceBuffer,
    pub(super) tiles: DeviceBuffer,
    pub(super) offsets: DeviceBuffer,
    pub(super) out: DeviceBuffer,
    /// The valid pairs in ascending order (the rows compared).
    pub(super) valid: Vec<usize>,
    pub(super) n_out: usize,
    pub(super) stage: Stage,
    pub(super) p: MoeProblem,
    pub(super) geo: LaunchGeometry,
    pub(super) reference: crate::families::RefFn,
    pub(super) bytes: u64,
    pub(super) ops: u64,
}

impl GemmWorkload {
    fn kargs(&self, copy: usize) -> Vec<KArg> {
        let planes = self.weights.get(copy);
        let w = ExpertWeights {
            q: planes[0].ptr(),
            d: planes.get(1).map_or(NULL, |b| b.ptr()),
        };
        let p = &self.p;
        match self.stage {
            Stage::GateUp => MoeGemmGateUpArgs {
                w,
                x: self.act.ptr(),
                sorted: self.sorted.ptr(),
                tiles: self.tiles.ptr(),
                offsets: self.offsets.ptr(),
                h: self.out.ptr(),
                d: p.d_model,
                ffn: p.ffn,
                n_used: p.used,
            }
            .kargs(),
            _ => MoeGemmDownArgs {
                w,
                h: self.act.ptr(),
                sorted: self.sorted.ptr(),
                tiles: self.tiles.ptr(),
                offsets: self.offsets.ptr(),
                yp: self.out.ptr(),
                d: p.d_model,
                ffn: p.ffn,
            }
            .kargs(),
        }
    }
}

/// The rows of `out` (`[pairs][n]`) of the valid pairs, in order, and the
/// count of words written in the other (skipped) rows.
pub(crate) fn split_rows(
    out: &[f32],
    valid: &[usize],
    pairs: usize,
    n: usize,
) -> (Vec<f32>, usize) {
    let mut rows = Vec::with_capacity(valid.len() * n);
    for &q in valid {
        rows.extend_from_slice(&out[q * n..(q + 1) * n]);
    }
    let mut is_valid = vec![false; pairs];
    for &q in valid {
        is_valid[q] = true;
    }
    let written = (0..pairs)
        .filter(|&q| !is_valid[q])
        .map(|q| {
            out[q * n..(q + 1) * n]
                .iter()
                .filter(|v| v.to_bits() != POISON_BITS)
                .count()
        })
        .sum();
    (rows, written)
}

impl Workload for GemmWorkload {
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
        let out: Vec<f32> = gpu.download(&self.out)?;
        let pairs = self.p.tokens * self.p.used;
        let (rows, written) = split_rows(&out, &self.valid, pairs, self.n_out);
        let (reference, replay) = (self.reference)();
        let mut rep = compare(&rows, &reference, replay.as_deref(), contract, tol);
        if written > 0 {
            rep.passed = false;
            rep.detail = format!(
                "{}; {written} words written in the rows of skipped pairs",
                rep.detail
            );
        }
        Ok(rep)
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.out)
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
