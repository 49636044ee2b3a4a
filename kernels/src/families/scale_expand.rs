//! `scale_expand`: the prefill GEMMs' scale plane (f32 scales, or the
//! k-quants' GEMM side words) computed on the device from the decode
//! GEMV's compact plane (f16 scales, or the GEMV side records), so that an
//! engine keeps one scale plane per matrix. Bitexact against
//! [`expand_replay`], which is `quant::repack`'s own output. See
//! kernels/cuda/scale_expand.cu.

use super::{mmq, seeded_inputs};
use crate::defines::{defines, int_in, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, Module};
use crate::kernel_family::Family;
use crate::problem::{check_wtype, matmul_of, Problem, WType};
use crate::quant::repack::{gemm_side_words, gemv_side_bytes, KSide};
use crate::quant::{GgmlType, QuantError};
use crate::verdict::{CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, Workload};

pub struct ScaleExpand;

/// The weight types with two scale planes: the 32-element quants and the
/// k-quants (F16/BF16 have none).
pub fn expands(wt: WType) -> bool {
    !wt.is_16bit()
}

/// Bytes of the GEMV's scale plane of a matrix of `groups` 32-element
/// groups: what the kernel reads.
pub fn src_bytes(wt: WType, groups: usize) -> usize {
    if wt.is_kquant() {
        groups / 8 * gemv_side_bytes(wt.ggml())
    } else {
        groups * 2
    }
}

/// Bytes of the GEMMs' scale plane of `groups` groups: what it writes.
pub fn dst_bytes(wt: WType, groups: usize) -> usize {
    if wt.is_kquant() {
        groups * gemm_side_words(wt.ggml()) * 4
    } else {
        groups * 4
    }
}

/// The CPU rule: the GEMMs' plane of an `[n][k]` matrix whose GGUF bytes
/// are `gguf`, as `quant::repack` builds it (f32 of each f16 scale; the
/// k-quants' GEMM side words). The kernel must reproduce it bit for bit
/// from the GEMV's plane.
pub fn expand_replay(wt: WType, gguf: &[u8], n: usize, k: usize) -> Result<Vec<u8>, QuantError> {
    let ty = wt.ggml();
    if wt.is_kquant() {
        Ok(crate::quant::repack::repack_kquant(ty, gguf, n * k, KSide::Gemm)?.side)
    } else {
        let (_, d16) = crate::quant::repack::block32_planes(ty, gguf, n, k);
        Ok(mmq::scales_f32(&d16)
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect())
    }
}

fn wtype_of(d: &Defines, p: &Problem) -> Result<WType, String> {
    let mp = matmul_of(p)?;
    let wt = check_wtype(d, mp)?;
    if !expands(wt) {
        return Err(format!(
            "WTYPE={}: 16-bit weights have no scale plane to expand",
            wt.define()
        ));
    }
    Ok(wt)
}

impl Family for ScaleExpand {
    fn name(&self) -> &'static str {
        "scale_expand"
    }
    fn entry(&self) -> &'static str {
        "scale_expand"
    }
    fn source_file(&self) -> &'static str {
        "scale_expand.cu"
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([("ALGO", 0i64), ("THREADS", 256)]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Bitexact
    }
    fn default_tolerance(&self, _d: &Defines, _p: &Problem) -> Tolerance {
        Tolerance::bitexact()
    }
    /// The problem is the matrix `[n][k]` (its `m` is not read: the
    /// expansion does not depend on the rows of the GEMM that follows).
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        _lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p)?;
        wtype_of(d, p)?;
        let threads = super::rows_common::threads(d)?;
        let groups = (mp.n as u64) * (mp.k as u64 / 32);
        // ALGO 0: a thread per group; 1: a thread per 8 groups.
        let units = match int_in(d, "ALGO", &[0, 1])? {
            0 => groups,
            _ => groups.div_ceil(8),
        };
        let blocks = units.div_ceil(threads as u64);
        if blocks > i32::MAX as u64 {
            return Err("problem too large for a 1-D grid".into());
        }
        Ok(LaunchGeometry {
            kernel: "scale_expand".into(),
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
        let mp = *matmul_of(p).map_err(GpuError::Rejected)?;
        let wt = wtype_of(d, p).map_err(GpuError::Rejected)?;
        let (n, k) = (mp.n, mp.k);
        let inputs = seeded_inputs(self.name(), &[n, k], wt, 1, n, k, 1, seed)?;
        let w = &inputs.w[0];
        let src: Vec<u8> = if wt.is_kquant() {
            w.side_gemv.clone()
        } else {
            w.dplane_f16.iter().flat_map(|h| h.to_le_bytes()).collect()
        };
        let want = expand_replay(wt, &w.gguf, n, k)
            .map_err(|e| GpuError::Other(format!("expanding test scales: {e}")))?;
        let groups = n * (k / 32);
        debug_assert_eq!(src.len(), src_bytes(wt, groups));
        debug_assert_eq!(want.len(), dst_bytes(wt, groups));
        Ok(Box::new(ExpandWorkload {
            src: gpu.upload(&src)?,
            out: gpu.alloc(want.len())?,
            want: want
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            groups,
            src_bytes: src.len(),
            geo: geo.clone(),
        }))
    }
}

struct ExpandWorkload {
    src: DeviceBuffer,
    out: DeviceBuffer,
    want: Vec<u32>,
    groups: usize,
    src_bytes: usize,
    geo: LaunchGeometry,
}

impl Workload for ExpandWorkload {
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
        let args = crate::bind::rows::ScaleExpandArgs {
            src: self.src.ptr(),
            dst: self.out.ptr(),
            groups: self.groups,
        };
        gpu.launch(m, &self.geo, &args.kargs())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        poison(gpu, &[&self.out])
    }
    fn evaluate(&self, gpu: &Gpu, _c: Contract, _tol: &Tolerance) -> Result<CheckReport, GpuError> {
        let got: Vec<u32> = gpu.download(&self.out)?;
        let unwritten = got
            .iter()
            .zip(&self.want)
            .filter(|(g, w)| **g == POISON_BITS && **w != POISON_BITS)
            .count();
        let bad = got.iter().zip(&self.want).filter(|(a, b)| a != b).count();
        Ok(CheckReport::exact(self.want.len(), bad, unwritten))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        gpu.download(&self.out)
    }
    fn bytes_per_call(&self) -> u64 {
        (self.src_bytes + 4 * self.want.len()) as u64
    }
    fn ops_per_call(&self) -> u64 {
        self.groups as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::quant::repack::{repack_kquant, KSide};

    /// A CPU model of the kernel's arithmetic on the GEMV plane (the
    /// rule its header states), held equal to `expand_replay`: the two
    /// planes carry the same information, and the kernel's formula is the
    /// right one.
    fn expand_model(wt: WType, src: &[u8], groups: usize) -> Vec<u8> {
        use crate::quant::blocks::{f16_to_f32, k_scale_min};
        let mut out = Vec::new();
        for g in 0..groups {
            let w: Vec<u32> = match wt {
                WType::Q8_0 | WType::Q4_0 => {
                    vec![f16_to_f32(u16::from_le_bytes([src[2 * g], src[2 * g + 1]])).to_bits()]
                }
                WType::Q4K | WType::Q5K => {
                    let rb = gemv_side_bytes(wt.ggml());
                    let rec = &src[g / 8 * rb..(g / 8 + 1) * rb];
                    let j = g % 8;
                    let d = f16_to_f32(u16::from_le_bytes([rec[0], rec[1]]));
                    let dmin = f16_to_f32(u16::from_le_bytes([rec[2], rec[3]]));
                    let (sc, m) = k_scale_min(j, &rec[4..16]);
                    let mut v = vec![(d * sc as f32).to_bits(), (dmin * m as f32).to_bits()];
                    if wt == WType::Q5K {
                        let o = 16 + 4 * j;
                        v.push(u32::from_le_bytes([
                            rec[o],
                            rec[o + 1],
                            rec[o + 2],
                            rec[o + 3],
                        ]));
                        v.push(0);
                    }
                    v
                }
                _ => {
                    let rb = gemv_side_bytes(wt.ggml());
                    let rec = &src[g / 8 * rb..(g / 8 + 1) * rb];
                    let j = g % 8;
                    let d = f16_to_f32(u16::from_le_bytes([rec[80], rec[81]]));
                    let word =
                        |o: usize| u32::from_le_bytes([rec[o], rec[o + 1], rec[o + 2], rec[o + 3]]);
                    vec![
                        (d * rec[64 + 2 * j] as i8 as f32).to_bits(),
                        (d * rec[64 + 2 * j + 1] as i8 as f32).to_bits(),
                        word(8 * j),
                        word(8 * j + 4),
                    ]
                }
            };
            out.extend(w.iter().flat_map(|x| x.to_le_bytes()));
        }
        out
    }

    #[test]
    fn the_gemv_plane_expands_to_the_gemm_plane_bit_for_bit() {
        let (n, k) = (5usize, 768usize);
        for wt in WType::ALL.into_iter().filter(|w| expands(*w)) {
            let mut rng = crate::families::rng_for("scale-expand-test", &[wt as usize], 1);
            let w = crate::families::make_weights(&mut rng, wt, n, k).expect("weights");
            let groups = n * k / 32;
            let src: Vec<u8> = if wt.is_kquant() {
                let g = repack_kquant(wt.ggml(), &w.gguf, n * k, KSide::Gemv).expect("gemv");
                g.side
            } else {
                w.dplane_f16.iter().flat_map(|h| h.to_le_bytes()).collect()
            };
            assert_eq!(src.len(), src_bytes(wt, groups), "{}", wt.define());
            let want = expand_replay(wt, &w.gguf, n, k).expect("replay");
            assert_eq!(want.len(), dst_bytes(wt, groups), "{}", wt.define());
            assert_eq!(expand_model(wt, &src, groups), want, "{}", wt.define());
        }
    }

    #[test]
    fn geometry_covers_every_group_and_16bit_weights_are_refused() {
        let f = ScaleExpand;
        let lim = DeviceLimits::for_arch(Arch(90));
        let d = f.default_defines(GgmlType::Q4K);
        let g = f
            .validate(&d, &Problem::matmul(1, 300, 2560, GgmlType::Q4K), &lim)
            .expect("valid");
        assert_eq!(g.grid.0 as usize, (300 * 2560 / 32usize).div_ceil(256));
        let mut q8 = f.default_defines(GgmlType::Q8_0);
        q8.insert("ALGO".into(), 1i64.into());
        let g8 = f
            .validate(&q8, &Problem::matmul(1, 3, 96, GgmlType::Q8_0), &lim)
            .expect("valid");
        assert_eq!(g8.grid.0, 1, "9 groups in 2 units of 8, one block");
        q8.insert("ALGO".into(), 2i64.into());
        assert!(f
            .validate(&q8, &Problem::matmul(1, 3, 96, GgmlType::Q8_0), &lim)
            .is_err());
        let d16 = f.default_defines(GgmlType::F16);
        let e = f
            .validate(&d16, &Problem::matmul(1, 8, 256, GgmlType::F16), &lim)
            .expect_err("refused");
        assert!(e.contains("no scale plane"), "{e}");
        let mut odd = d.clone();
        odd.insert("THREADS".into(), 100i64.into());
        assert!(f
            .validate(&odd, &Problem::matmul(1, 8, 256, GgmlType::Q4K), &lim)
            .is_err());
        assert!(f
            .validate(&d, &Problem::matmul(1, 8, 200, GgmlType::Q4K), &lim)
            .is_err());
    }
}
