//! Roofline ceilings and the binding roof of a measurement.
//!
//! Bandwidth roofs (HBM and L2) come from `kernels::timing::measure_ceilings`
//! on the device itself. Instruction-rate roofs cannot be measured per call
//! cheaply, so they come from a table of register-only microbenchmarks on the
//! same device type (docs/anchors.md §1, H100 80GB HBM3: `mma.sync` s8
//! m16n8k32 1297 TOPS, f16/bf16 m16n8k16 651 TFLOP/s, dp4a 94 TOPS). A device
//! missing from the table gets no compute roof and every row says so.

use gemtune_kernels::defines::Defines;

/// The instruction whose issue rate bounds a variant's arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Instr {
    /// `mma.sync` m16n8k32 s8 x s8 -> s32.
    MmaS8,
    /// `mma.sync` m16n8k16 f16/bf16 -> f32.
    MmaF16,
    /// `dp4a` on CUDA cores.
    Dp4a,
    /// FP32 FMA on CUDA cores.
    Ffma,
    /// Whatever bf16 tensor-core path a vendor library picks (wgmma on
    /// Hopper): bounded by the datasheet's dense rate, not a register loop.
    TensorBf16,
    /// The same for int8 tensor-core GEMM.
    TensorS8,
    /// No arithmetic roof (a format conversion: bandwidth only).
    None,
}

impl Instr {
    pub fn label(self) -> &'static str {
        match self {
            Instr::MmaS8 => "mma.s8",
            Instr::MmaF16 => "mma.f16",
            Instr::Dp4a => "dp4a",
            Instr::Ffma => "ffma",
            Instr::TensorBf16 => "tc.bf16",
            Instr::TensorS8 => "tc.s8",
            Instr::None => "none",
        }
    }
}

/// Measured peak rates of one device type, in ops/s (an FMA counts 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DevicePeaks {
    pub name_contains: &'static str,
    pub cc: (u32, u32),
    pub mma_s8: f64,
    pub mma_f16: f64,
    pub dp4a: f64,
    pub ffma: f64,
    /// Datasheet dense tensor-core rates (the roof of vendor reference rows,
    /// whose kernels may use instructions faster than `mma.sync`).
    pub dense_bf16: f64,
    pub dense_s8: f64,
    /// Where the numbers come from.
    pub source: &'static str,
}

/// Register-only peaks per device type. FFMA on H100 is the datasheet rate
/// (67 TFLOP/s for SXM5); the others are measured.
pub const PEAKS: &[DevicePeaks] = &[DevicePeaks {
    name_contains: "H100",
    cc: (9, 0),
    mma_s8: 1297e12,
    mma_f16: 651e12,
    dp4a: 94e12,
    ffma: 67e12,
    dense_bf16: 989e12,
    dense_s8: 1979e12,
    source: "docs/anchors.md §1, H100 80GB HBM3 register-only mma.sync/dp4a loops; ffma and dense tensor rates (reference rows) from the SXM5 datasheet",
}];

pub fn peaks_for(device_name: &str, cc: (u32, u32)) -> Option<&'static DevicePeaks> {
    PEAKS
        .iter()
        .find(|p| p.cc == cc && device_name.contains(p.name_contains))
}

impl DevicePeaks {
    pub fn rate(&self, i: Instr) -> Option<f64> {
        match i {
            Instr::MmaS8 => Some(self.mma_s8),
            Instr::MmaF16 => Some(self.mma_f16),
            Instr::Dp4a => Some(self.dp4a),
            Instr::Ffma => Some(self.ffma),
            Instr::TensorBf16 => Some(self.dense_bf16),
            Instr::TensorS8 => Some(self.dense_s8),
            Instr::None => None,
        }
    }
}

/// The instruction a family's variant computes with.
pub fn instr_of(family: &str, d: &Defines) -> Instr {
    let int = |k: &str| match d.get(k) {
        Some(gemtune_kernels::defines::DefineValue::Int(v)) => Some(*v),
        _ => None,
    };
    match family {
        "mmq" => Instr::MmaS8,
        "gemm_dq" => Instr::MmaF16,
        // wgmma has no register-loop figure in the table: the dense
        // tensor-core rate (f16 = bf16) is its roof.
        "gemm_wgmma" => Instr::TensorBf16,
        "gemv" => {
            if int("ALGO") == Some(1) {
                Instr::Dp4a
            } else {
                Instr::Ffma
            }
        }
        // The tensor-core attention runs QK^T and PV on mma.sync m16n8k16
        // (ALGO 1) or wgmma (ALGO 2); the scalar kernel on FMA. Decode is
        // bound by the KV bytes.
        "attn_prefill" | "attn_decode" => match int("ALGO") {
            Some(1) => Instr::MmaF16,
            // The wgmma loop: the dense tensor-core rate, as gemm_wgmma.
            Some(2) => Instr::TensorBf16,
            _ => Instr::Ffma,
        },
        _ => Instr::None,
    }
}

/// The instruction class of a vendor reference row (`variant` column of a
/// reference row, e.g. "cublas-bf16").
pub fn instr_of_reference(name: &str) -> Instr {
    if name.ends_with("-int8") {
        Instr::TensorS8
    } else if name.ends_with("-bf16") {
        Instr::TensorBf16
    } else {
        Instr::None
    }
}

/// Which roof bounds a row, and how close the row came to it.
#[derive(Clone, Debug, PartialEq)]
pub struct RoofVerdict {
    /// "HBM", "L2" or the instruction label.
    pub roof: String,
    /// The attainable time for this call under that roof, us.
    pub roof_time_us: f64,
    /// 100 * roof_time / measured time.
    pub pct_of_roof: f64,
    /// Ops per byte of the call.
    pub intensity: f64,
    /// One sentence: which roof binds and why.
    pub why: String,
}

/// `bandwidth_gbps`: the regime's bandwidth (HBM for dram, L2 for l2 when the
/// call's bytes fit in L2, else HBM). `compute`: (label, ops/s) or None.
pub fn verdict(
    bytes: u64,
    ops: u64,
    median_us: f64,
    bw_label: &str,
    bandwidth_gbps: f64,
    compute: Option<(&str, f64)>,
) -> RoofVerdict {
    let t_mem = bytes as f64 / (bandwidth_gbps * 1e9) * 1e6;
    let intensity = if bytes > 0 {
        ops as f64 / bytes as f64
    } else {
        f64::INFINITY
    };
    match compute {
        Some((label, rate)) if rate > 0.0 => {
            let t_cmp = ops as f64 / rate * 1e6;
            let ridge = rate / (bandwidth_gbps * 1e9);
            if t_cmp >= t_mem {
                RoofVerdict {
                    roof: label.to_string(),
                    roof_time_us: t_cmp,
                    pct_of_roof: 100.0 * t_cmp / median_us,
                    intensity,
                    why: format!(
                        "{label} binds: {intensity:.0} op/B is above the ridge {ridge:.0} op/B of {label} over {bw_label}"
                    ),
                }
            } else {
                RoofVerdict {
                    roof: bw_label.to_string(),
                    roof_time_us: t_mem,
                    pct_of_roof: 100.0 * t_mem / median_us,
                    intensity,
                    why: format!(
                        "{bw_label} binds: {intensity:.1} op/B is below the ridge {ridge:.0} op/B of {label} over {bw_label}"
                    ),
                }
            }
        }
        _ => RoofVerdict {
            roof: bw_label.to_string(),
            roof_time_us: t_mem,
            pct_of_roof: 100.0 * t_mem / median_us,
            intensity,
            why: format!("{bw_label} binds: no arithmetic roof known for this instruction/device"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_binds_a_gemv() {
        // 26 MB, 2 ops per weight byte pair: far below any ridge.
        let v = verdict(
            26_214_400,
            52_428_800,
            10.0,
            "HBM",
            3000.0,
            Some(("dp4a", 94e12)),
        );
        assert_eq!(v.roof, "HBM");
        assert!((v.roof_time_us - 26_214_400.0 / 3000e9 * 1e6).abs() < 1e-9);
        assert!((v.pct_of_roof - 100.0 * v.roof_time_us / 10.0).abs() < 1e-9);
    }

    #[test]
    fn tensor_rate_binds_a_big_gemm() {
        let ops = 2u64 * 2048 * 10240 * 2560;
        let bytes = 10240u64 * 2560 + 2048 * 2560 * 4;
        let v = verdict(bytes, ops, 300.0, "HBM", 3100.0, Some(("mma.s8", 1297e12)));
        assert_eq!(v.roof, "mma.s8");
        assert!(v.why.contains("above the ridge"));
    }

    #[test]
    fn h100_is_in_the_table() {
        let p = peaks_for("NVIDIA H100 80GB HBM3", (9, 0)).expect("H100 peaks");
        assert_eq!(p.rate(Instr::MmaS8), Some(1297e12));
        assert_eq!(
            p.rate(instr_of_reference("cublas-bf16")),
            Some(p.dense_bf16)
        );
        assert_eq!(p.rate(instr_of_reference("cublas-int8")), Some(p.dense_s8));
        assert!(peaks_for("NVIDIA A100", (8, 0)).is_none());
    }
}
