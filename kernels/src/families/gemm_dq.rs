//! `gemm_dq`: prefill GEMM that dequantizes weight tiles to f16/bf16 in
//! registers (straight into MMA fragments) and runs f16/bf16 MMA (m16n8k16,
//! fp32 accumulation).
//! Activations are converted by the `gemm_dq_convert` pre-pass (run once when
//! the workload is built; not timed). See kernels/cuda/gemm_dq.cu.

use super::gemv::fp_rms_bound;
use super::tiles::{bkw, gemm_wtype, geometry, pad16, read_tiles, scale_words};
use super::{matmul_f64, memo, seeded_inputs, MatmulWorkload};
use crate::bind::matmul::MatmulBinding;
use crate::bind::{Act, NULL};
use crate::defines::{defines, get_str, DefineValue, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{matmul_of, Problem};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::{OpKind, WeightSet, Workload};

pub struct GemmDq;

pub(crate) fn is_bf16(d: &Defines) -> Result<bool, String> {
    match get_str(d, "DQ_TYPE")?.as_str() {
        "F16" => Ok(false),
        "BF16" => Ok(true),
        o => Err(format!("DQ_TYPE={o}: must be F16 or BF16")),
    }
}

/// Rounds to the MMA operand type and back (the replay's operand rule).
fn round_op(v: f32, bf16: bool) -> f32 {
    if bf16 {
        bf16_to_f32(f32_to_bf16(v))
    } else {
        f16_to_f32(f32_to_f16(v))
    }
}

impl Family for GemmDq {
    fn name(&self) -> &'static str {
        "gemm_dq"
    }
    fn entry(&self) -> &'static str {
        "gemm_dq"
    }
    fn source_file(&self) -> &'static str {
        "gemm_dq.cu"
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("BM", 128i64),
            ("BN", 128),
            ("BK", 64),
            ("WARPS_M", 2),
            ("WARPS_N", 4),
            ("STAGES", 3),
            ("CP_ASYNC", 1),
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
        let t = read_tiles(d, lim, 8)?;
        let stage = t.bm * pad16(2 * t.bk)
            + t.bn * pad16(bkw(wt, t.bk))
            + 4 * t.bn * (t.bk / 32) * scale_words(wt);
        geometry("gemm_dq", &t, mp, t.stages * stage, lim)
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        dq_workload(self, gpu, d, p, geo, seed)
    }
}

/// Operand rounding (2^-11 for f16, 2^-8 for bf16, on both operands) gives a
/// k-independent relative RMS error of about u/sqrt(3)*sqrt(2); the bound
/// allows ~4x that. The replay differs only by fp32 summation. Shared by
/// every family that rounds both operands to DQ_TYPE.
pub(crate) fn dq_tolerance(d: &Defines, p: &Problem) -> Tolerance {
    rounded_operands_tolerance(
        is_bf16(d).unwrap_or(true),
        matmul_of(p).map(|m| m.k).unwrap_or(32),
    )
}

/// The bound for a k-long f32-accumulated product of operands rounded to
/// bf16 (`bf16`) or f16: shared by every GEMM on rounded operands,
/// vendor references included.
pub(crate) fn rounded_operands_tolerance(bf16: bool, k: usize) -> Tolerance {
    let u = if bf16 {
        f64::powi(2.0, -8)
    } else {
        f64::powi(2.0, -11)
    };
    Tolerance {
        rms_rel: 4.0 * u,
        max_rel: 20.0 * u,
        outlier_frac: 1e-3,
        replay_rms_rel: 2.0 * fp_rms_bound(k),
    }
}

/// Inputs, reference and launch for a GEMM over gemm_dq's operands: weight
/// planes (quants and f32 scales, or the k-quants' nibble plane and GEMM
/// side words, or F16/BF16 as stored), activations converted once by the
/// `gemm_dq_convert` pre-pass (dq_convert.cuh, part of `f`'s module) into
/// the k-permuted DQ_TYPE layout, launched through the family's
/// `MatmulBinding` (which also says whether y is zeroed before every call).
pub(crate) fn dq_workload(
    f: &dyn Family,
    gpu: &Gpu,
    d: &Defines,
    p: &Problem,
    geo: &LaunchGeometry,
    seed: u64,
) -> Result<Box<dyn Workload>, GpuError> {
    let mp = matmul_of(p).map_err(GpuError::Rejected)?;
    let wt = gemm_wtype(d, mp).map_err(GpuError::Rejected)?;
    let bf16 = is_bf16(d).map_err(GpuError::Rejected)?;
    let (m, n, k) = (mp.m, mp.n, mp.k);
    // gemm_dq and gemm_wgmma compute the same function from one input
    // generator, so with the same seed they see the same inputs and share the
    // memoized reference.
    let inputs = seeded_inputs("gemm_dq", &[m, n, k, wt as usize], wt, m, n, k, 1, seed)?;
    let binding = MatmulBinding::of(f.name(), d).map_err(GpuError::Rejected)?;
    let planes = inputs.w[0].upload(gpu, wt, binding.layout)?;
    let weight_bytes: u64 = planes.iter().map(|b| b.bytes() as u64).sum();
    // The pre-pass converts x on the GPU once (into the k-permuted layout
    // only these GEMMs read); its output is what the GEMM reads, so the
    // check covers it too.
    let x_dev = gpu.upload(&inputs.x)?;
    let xh = gpu.alloc(m * k * 2)?;
    let module = gpu.load(&crate::compile::compile(
        f,
        d,
        gpu.arch(),
        crate::compile::default_cache_dir().as_deref(),
    )?)?;
    let act = Act {
        format: binding.act,
        data: xh.ptr(),
        scales: NULL,
    };
    let pre = binding
        .prepass_kargs(x_dev.ptr(), &act, m, k)
        .ok_or_else(|| GpuError::Other(format!("{}: no activation pre-pass", f.name())))?;
    gpu.launch(&module, &MatmulBinding::dq_convert_geometry(m, k), &pre)?;
    gpu.synchronize()?;
    let y = gpu.alloc(m * n * 4)?;
    let key = format!("dq {m} {n} {k} {wt:?} {seed}");
    let reference: super::RefFn = Box::new(move || {
        let (deq, x) = (&inputs.w[0].deq, &inputs.x);
        let r = memo::get(format!("{key} ref"), || matmul_f64(deq, x, m, n, k));
        let rp = memo::get(format!("{key} replay bf16={bf16}"), || {
            let wr: Vec<f32> = deq.iter().map(|&v| round_op(v, bf16)).collect();
            let xr: Vec<f32> = x.iter().map(|&v| round_op(v, bf16)).collect();
            matmul_f64(&wr, &xr, m, n, k)
        });
        ((*r).clone(), Some((*rp).clone()))
    });
    Ok(Box::new(MatmulWorkload {
        weights: WeightSet::new(planes),
        _acts: vec![xh],
        act,
        y,
        side: None,
        tail: None,
        geo: geo.clone(),
        binding,
        m,
        n,
        k,
        reference,
        bytes: weight_bytes + (m * k * 2 + m * n * 4) as u64,
        ops: 2 * (m * n * k) as u64,
        op_kind: OpKind::Flop,
    }))
}

#[cfg(test)]
mod tests {
    use crate::problem::WType;

    /// dq_ktypes.cuh's `dq_ktype_words` replayed on the CPU over the staged
    /// GEMM side words, fragment slot by fragment slot: thread t of k16 step
    /// ks reads nibble word t of group ks / 2 and covers elements
    /// 16 (ks % 2) + 4t + b; every element of every group must come out as
    /// ggml's value (before the operand rounding), once.
    #[test]
    fn kquant_fragment_decode_replays_the_dequantization() {
        let word = |b: &[u8], o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let qf =
            |w: u32, b: usize| f32::from_bits(0x4B00_0000 | ((w >> (8 * b)) & 0xff)) - 8_388_608.0;
        for wt in [WType::Q4K, WType::Q5K, WType::Q6K] {
            let (n, k) = (3usize, 512usize);
            let mut rng = super::super::rng_for("gemm-kq-replay", &[n, k, wt as usize], 1);
            let w = super::super::make_weights(&mut rng, wt, n, k).expect("weights");
            let nw = crate::quant::repack::gemm_side_words(wt.ggml());
            let mut seen = vec![0u8; n * k];
            for row in 0..n {
                for g in 0..k / 32 {
                    let nib = &w.qplane[row * k / 2 + 16 * g..][..16];
                    let side = &w.side_gemm[(row * k / 32 + g) * nw * 4..][..nw * 4];
                    let sd = |i: usize| word(side, 4 * i);
                    for half in 0..2 {
                        for t in 0..4 {
                            let v = word(nib, 4 * t);
                            let mut q = if half == 1 {
                                (v >> 4) & 0x0F0F_0F0F
                            } else {
                                v & 0x0F0F_0F0F
                            };
                            match wt {
                                WType::Q5K => q |= ((sd(2) >> (t + 4 * half)) & 0x0101_0101) << 4,
                                WType::Q6K => q |= ((sd(2 + half) >> (2 * t)) & 0x0303_0303) << 4,
                                _ => {}
                            }
                            for b in 0..4 {
                                let got = if wt == WType::Q6K {
                                    f32::from_bits(sd(half)) * (qf(q, b) - 32.0)
                                } else {
                                    qf(q, b).mul_add(f32::from_bits(sd(0)), -f32::from_bits(sd(1)))
                                };
                                let e = row * k + 32 * g + 16 * half + 4 * t + b;
                                seen[e] += 1;
                                assert_eq!(got.to_bits(), w.deq[e].to_bits(), "{wt:?} element {e}");
                            }
                        }
                    }
                }
            }
            assert!(
                seen.iter().all(|&c| c == 1),
                "{wt:?}: an element read twice or never"
            );
        }
    }
}
