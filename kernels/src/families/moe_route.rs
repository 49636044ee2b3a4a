//! `moe_route`: the mixture-of-experts router of a decode step (1..8
//! tokens): router GEMV, softmax, top-k, renormalization and per-expert
//! scales in one launch. See kernels/cuda/moe_route.cu and
//! `bind::moe::MoeRouteArgs`.
//!
//! Contract: the logits are fp against the f64 oracle; the selection is
//! bit-exact given the kernel's own logits (`oracle::route_topk`'s rule:
//! larger logit first, the lower expert index among equal ones), and the
//! weights are fp against the f64 softmax of those logits. The check inputs
//! force ties: three experts share one router row (identical bytes, so the
//! kernel's logits for them are identical) aligned with token 0's input, so
//! they lead its ranking and the tie rule decides their order; a fourth row
//! differs from them in one element (a near-tie).

use super::gemv::fp_rms_bound;
use super::{memo, random_matrix, rng_for};
use crate::bind::moe::MoeRouteArgs;
use crate::defines::{defines, get_str, int_in, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::kernel_family::Family;
use crate::oracle::{route_topk, route_weights};
use crate::problem::{moe_of, MoeProblem, Problem, ProblemKind};
use crate::quant::{dequantize_row, quantize_row, GgmlType};
use crate::verdict::{compare, CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, Workload};
use rand::Rng;

pub struct MoeRoute;

/// Router weight types the kernel reads (as GGUF stores them).
pub const ROUTER_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
];

/// Most experts the ranking holds and most chosen per token
/// (MAX_EXPERTS, MAX_USED of moe_route.cu).
pub const MAX_EXPERTS: usize = 256;
pub const MAX_USED: usize = 32;

/// The router type named by WTYPE, checked against the shape's.
fn router_type(d: &Defines, shape: GgmlType) -> Result<GgmlType, String> {
    let w = get_str(d, "WTYPE")?;
    let t = ROUTER_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(&w))
        .ok_or_else(|| {
            format!("WTYPE={w}: moe_route reads F32, F16, BF16, Q8_0 and Q4_0 router weights")
        })?;
    if w != t.name().to_ascii_uppercase() {
        return Err(format!(
            "WTYPE={w}: write it in upper case ({}), the kernel compares macro names",
            t.name().to_ascii_uppercase()
        ));
    }
    if t != shape {
        return Err(format!(
            "WTYPE={w} does not match the shape's router type {}",
            shape.name()
        ));
    }
    Ok(t)
}

/// Elements per chunk a lane reads (d must be a multiple).
fn chunk_elems(t: GgmlType) -> usize {
    match t {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::Bf16 => 8,
        _ => 32,
    }
}

/// The seeded router of a check: E rows of d as `t` (GGUF bytes and exact
/// values), with the forced ties of the module doc, plus z and the scales.
pub(crate) struct RouteInputs {
    pub bytes: Vec<u8>,
    pub deq: Vec<f32>,
    pub z: Vec<f32>,
    pub scale: Vec<f32>,
}

/// The experts that share token 0's aligned router row (identical bytes)
/// and the near-tie, for `experts` >= 4 (fewer: none).
pub(crate) fn tied_experts(experts: usize) -> (Vec<usize>, Option<usize>) {
    if experts < 4 {
        return (Vec::new(), None);
    }
    (vec![0, experts / 2, experts - 1], Some(1))
}

pub(crate) fn route_inputs(
    p: &MoeProblem,
    t: GgmlType,
    seed: u64,
) -> Result<RouteInputs, GpuError> {
    let (e, d) = (p.experts, p.d_model);
    let mut rng = rng_for("moe_route", &[p.tokens, e, d, p.used, t as usize], seed);
    let z = random_matrix(&mut rng, p.tokens, d);
    let mut w = random_matrix(&mut rng, e, d);
    let (ties, near) = tied_experts(e);
    if let Some(&lead) = ties.first() {
        // Aligned with token 0, its logit three times the largest of the
        // random rows', so the tied experts lead token 0's ranking.
        let z0 = &z[..d];
        let dot = |r: usize| -> f32 {
            w[r * d..(r + 1) * d]
                .iter()
                .zip(z0)
                .map(|(a, b)| a * b)
                .sum()
        };
        let top = (0..e).map(|r| dot(r).abs()).fold(0f32, f32::max);
        let norm2: f32 = z0.iter().map(|v| v * v).sum();
        let c = 3.0 * top.max(1.0) / norm2.max(f32::MIN_POSITIVE);
        for i in 0..d {
            w[lead * d + i] = c * z0[i];
        }
        let row: Vec<f32> = w[lead * d..(lead + 1) * d].to_vec();
        for &r in &ties[1..] {
            w[r * d..(r + 1) * d].copy_from_slice(&row);
        }
        if let Some(n) = near {
            // A quarter of the last block's largest magnitude on its last
            // element: more than one quantization step of every type.
            let amax = row[d.saturating_sub(32)..]
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()));
            w[n * d..(n + 1) * d].copy_from_slice(&row);
            w[n * d + d - 1] += 0.25 * amax;
        }
    }
    let scale: Vec<f32> = (0..e).map(|_| rng.random_range(0.5f32..1.5)).collect();
    let rb = t
        .row_bytes(d as u64)
        .ok_or_else(|| GpuError::Rejected(format!("{d} is not whole {} blocks", t.name())))?
        as usize;
    let mut bytes = vec![0u8; e * rb];
    let mut deq = vec![0f32; e * d];
    for r in 0..e {
        let err = |x: crate::quant::QuantError| GpuError::Other(format!("router: {x}"));
        quantize_row(t, &w[r * d..(r + 1) * d], &mut bytes[r * rb..(r + 1) * rb]).map_err(err)?;
        dequantize_row(
            t,
            &bytes[r * rb..(r + 1) * rb],
            &mut deq[r * d..(r + 1) * d],
        )
        .map_err(err)?;
    }
    Ok(RouteInputs {
        bytes,
        deq,
        z,
        scale,
    })
}

/// The tolerance of the weights: f32 softmax (expf, one division) and
/// renormalization of the kernel's own logits, against f64.
pub(crate) const WEIGHTS_TOL: Tolerance = Tolerance {
    rms_rel: 4e-6,
    max_rel: 2e-5,
    outlier_frac: 0.0,
    replay_rms_rel: 4e-6,
};

impl Family for MoeRoute {
    fn name(&self) -> &'static str {
        "moe_route"
    }
    fn entry(&self) -> &'static str {
        "moe_route_n"
    }
    fn source_file(&self) -> &'static str {
        "moe_route.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Moe
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([("ROWS", 1i64), ("WARPS", 4)]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Fp
    }
    fn default_tolerance(&self, _d: &Defines, p: &Problem) -> Tolerance {
        let fp = fp_rms_bound(moe_of(p).map(|m| m.d_model).unwrap_or(32));
        Tolerance::fp(fp)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = moe_of(p)?;
        let t = router_type(d, mp.wtype)?;
        let rows = int_in(d, "ROWS", &[1, 2, 4])?;
        let warps = int_in(d, "WARPS", &[1, 2, 4, 8])?;
        let unit = chunk_elems(t);
        if mp.d_model % unit != 0 {
            return Err(format!(
                "d_model={} is not a multiple of {unit}: a lane reads {} router rows {unit} elements at a time",
                mp.d_model,
                t.name().to_ascii_uppercase()
            ));
        }
        if !(1..=8).contains(&mp.tokens) {
            return Err(format!(
                "moe_route handles 1..8 tokens (a decode step), not m={}",
                mp.tokens
            ));
        }
        if mp.experts > MAX_EXPERTS {
            return Err(format!(
                "{} experts: the ranking holds at most {MAX_EXPERTS} (8 logits per lane)",
                mp.experts
            ));
        }
        if mp.used > MAX_USED {
            return Err(format!(
                "used = {}: at most {MAX_USED} experts per token (one per lane)",
                mp.used
            ));
        }
        let threads = (warps * 32) as u32;
        if threads > lim.max_threads_per_block {
            return Err(format!(
                "{threads} threads exceed the device's {}",
                lim.max_threads_per_block
            ));
        }
        Ok(LaunchGeometry {
            kernel: format!("moe_route_n{}", mp.tokens),
            grid: (mp.experts.div_ceil(rows as usize) as u32, 1, 1),
            block: (threads, 1, 1),
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
        let mp = *moe_of(p).map_err(GpuError::Rejected)?;
        let t = router_type(d, mp.wtype).map_err(GpuError::Rejected)?;
        let key = format!("moe_route inputs {mp:?} {seed}");
        let inp = memo::get_or_try(key, || route_inputs(&mp, t, seed))?;
        let (tk, e, k) = (mp.tokens, mp.experts, mp.used);
        let w = gpu.upload(&inp.bytes)?;
        let z = gpu.upload(&inp.z)?;
        let scale = gpu.upload(&inp.scale)?;
        let logits = gpu.alloc(tk * e * 4)?;
        let ids = gpu.alloc(tk * k * 4)?;
        let weights = gpu.alloc(tk * k * 4)?;
        let counter = gpu.upload(&[0u32])?;
        let args = MoeRouteArgs {
            w: w.ptr(),
            z: z.ptr(),
            scale: scale.ptr(),
            logits: logits.ptr(),
            ids: ids.ptr(),
            weights: weights.ptr(),
            counter: counter.ptr(),
            d: mp.d_model,
            n_experts: e,
            n_used: k,
        };
        let bytes = (inp.bytes.len() + inp.z.len() * 4 + e * 4 + tk * (e + 2 * k) * 4) as u64;
        Ok(Box::new(RouteWorkload {
            weights_rot: vec![w],
            _inputs: vec![z, scale, counter],
            logits,
            ids,
            weights,
            args,
            geo: geo.clone(),
            p: mp,
            inputs: inp,
            seed,
            bytes,
        }))
    }
}

struct RouteWorkload {
    /// The router and its DRAM-regime copies (copy 0 first).
    weights_rot: Vec<DeviceBuffer>,
    /// z, the scales and the counter, kept alive for the kernel.
    _inputs: Vec<DeviceBuffer>,
    logits: DeviceBuffer,
    ids: DeviceBuffer,
    weights: DeviceBuffer,
    args: MoeRouteArgs,
    geo: LaunchGeometry,
    p: MoeProblem,
    inputs: std::sync::Arc<RouteInputs>,
    seed: u64,
    bytes: u64,
}

impl RouteWorkload {
    fn kargs(&self, copy: usize) -> Vec<KArg> {
        let mut a = self.args;
        a.w = self.weights_rot[copy % self.weights_rot.len()].ptr();
        a.kargs()
    }
}

/// Judges a router output: the logits against the f64 router product
/// (`tol`), the ids against the selection rule replayed on the kernel's
/// logits (exact), the weights against their f64 values from those logits
/// (`WEIGHTS_TOL`). `reference` is the f64 logits `[tokens][experts]`.
pub(crate) fn judge_routing(
    logits: &[f32],
    ids: &[i32],
    weights: &[f32],
    reference: &[f64],
    scale: &[f32],
    p: &MoeProblem,
    tol: &Tolerance,
) -> CheckReport {
    let (e, k) = (p.experts, p.used);
    let mut rep = compare(logits, reference, None, Contract::Fp, tol);
    let mut bad_ids = 0usize;
    let mut unwritten = 0usize;
    let mut first_bad = None;
    let mut want_w = Vec::with_capacity(p.tokens * k);
    for t in 0..p.tokens {
        let row = &logits[t * e..(t + 1) * e];
        // Poisoned or non-finite logits are reported by `compare`; rank the
        // rest as they are.
        let sel = route_topk(row, k);
        for j in 0..k {
            let got = ids[t * k + j];
            if got as u32 == POISON_BITS {
                unwritten += 1;
            } else if sel.get(j).map(|&s| s as i32) != Some(got) {
                bad_ids += 1;
                first_bad.get_or_insert((t, j, got, sel.get(j).copied()));
            }
        }
        want_w.extend(route_weights(row, &sel, scale));
    }
    let wrep = compare(weights, &want_w, None, Contract::Fp, &WEIGHTS_TOL);
    let mut reasons = Vec::new();
    if !rep.passed {
        reasons.push(format!("logits: {}", rep.detail));
    }
    if bad_ids > 0 || unwritten > 0 {
        let first = first_bad
            .map(|(t, j, g, w)| format!(" (first: token {t} rank {j}: got {g}, rule gives {w:?})"))
            .unwrap_or_default();
        reasons.push(format!(
            "ids: {bad_ids} of {} differ from the selection rule on the kernel's logits, {unwritten} unwritten{first}",
            p.tokens * k
        ));
    }
    if !wrep.passed {
        reasons.push(format!("weights: {}", wrep.detail));
    }
    rep.passed = reasons.is_empty();
    rep.unwritten += unwritten + wrep.unwritten;
    rep.non_finite += wrep.non_finite;
    rep.outliers += bad_ids + wrep.outliers;
    rep.rms_rel = rep.rms_rel.max(wrep.rms_rel);
    rep.max_rel = rep.max_rel.max(wrep.max_rel);
    rep.detail = if reasons.is_empty() {
        format!(
            "ok ({} logits; {} ids exact; weights rms_rel {:.1e})",
            logits.len(),
            ids.len(),
            wrep.rms_rel
        )
    } else {
        reasons.join("; ")
    };
    rep
}

impl Workload for RouteWorkload {
    fn weight_bytes(&self) -> u64 {
        self.weights_rot[0].bytes() as u64
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.weights_rot.truncate(n.max(1));
        while self.weights_rot.len() < n {
            let b = gpu.alloc(self.weights_rot[0].bytes())?;
            gpu.copy(&b, &self.weights_rot[0])?;
            self.weights_rot.push(b);
        }
        gpu.synchronize()
    }
    fn weight_copies(&self) -> usize {
        self.weights_rot.len()
    }
    fn launch(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        gpu.launch(m, &self.geo, &self.kargs(copy))
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.logits, &self.ids, &self.weights])
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        _contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let logits: Vec<f32> = gpu.download(&self.logits)?;
        let ids: Vec<i32> = gpu.download(&self.ids)?;
        let weights: Vec<f32> = gpu.download(&self.weights)?;
        let p = self.p;
        let inp = self.inputs.clone();
        let reference = memo::get(format!("moe_route ref {p:?} {}", self.seed), || {
            super::matmul_f64(&inp.deq, &inp.z, p.tokens, p.experts, p.d_model)
        });
        Ok(judge_routing(
            &logits, &ids, &weights, &reference, &inp.scale, &p, tol,
        ))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v: Vec<u32> = gpu.download(&self.logits)?;
        v.extend(gpu.download::<u32>(&self.ids)?);
        v.extend(gpu.download::<u32>(&self.weights)?);
        Ok(v)
    }
    fn bytes_per_call(&self) -> u64 {
        self.bytes
    }
    fn ops_per_call(&self) -> u64 {
        2 * (self.p.tokens * self.p.experts * self.p.d_model) as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;

    fn prob(tokens: usize, experts: usize, used: usize, d: usize, t: GgmlType) -> Problem {
        Problem::Moe(MoeProblem {
            tokens,
            d_model: d,
            ffn: 704,
            experts,
            used,
            wtype: t,
        })
    }

    #[test]
    fn validate_gives_the_geometry_and_rejects_bad_points() {
        let f = MoeRoute;
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = f.default_defines(GgmlType::F32);
        let g = f
            .validate(&d, &prob(8, 128, 8, 2816, GgmlType::F32), &lim)
            .expect("26B-A4B router");
        assert_eq!(g.kernel, "moe_route_n8");
        assert_eq!(g.grid, (128, 1, 1));
        assert_eq!(g.block, (128, 1, 1));
        let mut r4 = d.clone();
        r4.insert("ROWS".into(), 4i64.into());
        assert_eq!(
            f.validate(&r4, &prob(1, 130, 2, 2816, GgmlType::F32), &lim)
                .expect("partial block of experts")
                .grid,
            (33, 1, 1)
        );
        let bad = |d: &Defines, p: Problem, want: &str| {
            let e = f.validate(d, &p, &lim).expect_err(want);
            assert!(e.contains(want), "{e}");
        };
        bad(&d, prob(9, 128, 8, 2816, GgmlType::F32), "1..8 tokens");
        bad(&d, prob(1, 300, 8, 2816, GgmlType::F32), "at most 256");
        bad(&d, prob(1, 64, 33, 2816, GgmlType::F32), "at most 32");
        bad(&d, prob(1, 8, 9, 2816, GgmlType::F32), "used = 9");
        bad(
            &d,
            prob(1, 8, 2, 2818, GgmlType::F32),
            "not a multiple of 4",
        );
        bad(&d, prob(1, 8, 2, 2816, GgmlType::Q8_0), "does not match");
        let q8 = f.default_defines(GgmlType::Q8_0);
        bad(
            &q8,
            prob(1, 8, 2, 2832 + 8, GgmlType::Q8_0),
            "multiple of 32",
        );
        let f16 = f.default_defines(GgmlType::F16);
        bad(&f16, prob(1, 8, 2, 2820, GgmlType::F16), "multiple of 8");
        let k = f.default_defines(GgmlType::Q4K);
        bad(
            &k,
            prob(1, 8, 2, 2816, GgmlType::Q4K),
            "moe_route reads F32",
        );
        let mut lower = d.clone();
        lower.insert("WTYPE".into(), "f32".into());
        bad(
            &lower,
            prob(1, 8, 2, 2816, GgmlType::F32),
            "upper case (F32)",
        );
        let mut rows = d.clone();
        rows.insert("ROWS".into(), 3i64.into());
        bad(&rows, prob(1, 8, 2, 2816, GgmlType::F32), "ROWS=3");
        let mut warps = d.clone();
        warps.insert("WARPS".into(), 16i64.into());
        bad(&warps, prob(1, 8, 2, 2816, GgmlType::F32), "WARPS=16");
        let mm = Problem::matmul(1, 128, 2816, GgmlType::F32);
        bad(&d, mm, "runs on moe shapes");
    }

    /// The check inputs hold the forced ties: the tied experts' router rows
    /// are byte-identical, lead token 0's f64 logits, and the near-tie
    /// row differs from them.
    #[test]
    fn check_inputs_force_ties_at_the_top() {
        for t in ROUTER_TYPES {
            for (e, k) in [(8usize, 2usize), (128, 8)] {
                let p = MoeProblem {
                    tokens: 2,
                    d_model: 256,
                    ffn: 64,
                    experts: e,
                    used: k,
                    wtype: *t,
                };
                let inp = route_inputs(&p, *t, 3).expect("inputs");
                let rb = inp.bytes.len() / e;
                let (ties, near) = tied_experts(e);
                let row = |r: usize| &inp.bytes[r * rb..(r + 1) * rb];
                for &r in &ties[1..] {
                    assert_eq!(row(r), row(ties[0]), "{t:?} E={e}: expert {r}");
                }
                let n = near.expect("near-tie");
                assert_ne!(
                    &inp.deq[n * 256..(n + 1) * 256],
                    &inp.deq[0..256],
                    "{t:?} E={e}: the near-tie row must differ"
                );
                let logits = super::super::matmul_f64(&inp.deq, &inp.z, 2, e, 256);
                let l32: Vec<f32> = logits[..e].iter().map(|&v| v as f32).collect();
                let sel = route_topk(&l32, 3);
                // Either the near-tie outranks them all (its logit is larger)
                // or the three tied experts lead in index order.
                let tied: Vec<usize> = sel.iter().copied().filter(|i| ties.contains(i)).collect();
                assert!(
                    tied == ties || (sel[0] == n && tied == ties[..2]),
                    "{t:?} E={e}: {sel:?}"
                );
            }
        }
    }

    /// `judge_routing` fails a wrong tie order, a swapped id, an unwritten
    /// id and a wrong weight, and passes the rule's own output.
    #[test]
    fn judge_catches_selection_errors() {
        let p = MoeProblem {
            tokens: 2,
            d_model: 32,
            ffn: 32,
            experts: 6,
            used: 2,
            wtype: GgmlType::F32,
        };
        let logits = vec![
            1.0f32, 3.0, 3.0, 0.5, -1.0, 2.0, 0.0, 0.0, 0.0, 4.0, 1.0, 0.0,
        ];
        let reference: Vec<f64> = logits.iter().map(|&v| v as f64).collect();
        let scale = vec![1.0f32, 0.5, 2.0, 1.0, 1.5, 1.0];
        let good_ids = vec![1i32, 2, 3, 4];
        let w = |ids: &[i32]| -> Vec<f32> {
            let mut out = Vec::new();
            for t in 0..2 {
                let sel: Vec<usize> = ids[2 * t..2 * t + 2].iter().map(|&i| i as usize).collect();
                out.extend(
                    route_weights(&logits[6 * t..6 * t + 6], &sel, &scale)
                        .iter()
                        .map(|&v| v as f32),
                );
            }
            out
        };
        let tol = MoeRoute.default_tolerance(&Defines::new(), &Problem::Moe(p));
        let ok = judge_routing(
            &logits,
            &good_ids,
            &w(&good_ids),
            &reference,
            &scale,
            &p,
            &tol,
        );
        assert!(ok.passed, "{}", ok.detail);
        // Token 0: experts 1 and 2 tie at 3.0; 2 before 1 breaks the rule.
        let swapped = vec![2i32, 1, 3, 4];
        let r = judge_routing(
            &logits,
            &swapped,
            &w(&good_ids),
            &reference,
            &scale,
            &p,
            &tol,
        );
        assert!(
            !r.passed && r.detail.contains("ids: 2 of 4"),
            "{}",
            r.detail
        );
        let mut unwritten = good_ids.clone();
        unwritten[3] = POISON_BITS as i32;
        let r = judge_routing(
            &logits,
            &unwritten,
            &w(&good_ids),
            &reference,
            &scale,
            &p,
            &tol,
        );
        assert!(
            !r.passed && r.detail.contains("1 unwritten"),
            "{}",
            r.detail
        );
        let mut bad_w = w(&good_ids);
        bad_w[1] *= 1.001;
        let r = judge_routing(&logits, &good_ids, &bad_w, &reference, &scale, &p, &tol);
        assert!(!r.passed && r.detail.contains("weights:"), "{}", r.detail);
        let mut bad_l = logits.clone();
        bad_l[4] += 0.01;
        let r = judge_routing(
            &bad_l,
            &good_ids,
            &w(&good_ids),
            &reference,
            &scale,
            &p,
            &tol,
        );
        assert!(!r.passed && r.detail.contains("logits:"), "{}", r.detail);
    }
}
