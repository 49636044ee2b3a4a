//! `quantize_q8_1`: f32 activations -> Q8_1 planes (int8 quants + (d, sum))
//! with OUT=Q8_1, or split Q8 records with OUT=Q8_SPLIT. Bitexact against
//! `families::q8_1_replay` / `families::q8_split_records`.

use super::{q8_1_replay, q8_split_records, random_matrix, rng_for};
use crate::bind::matmul::Prepass;
use crate::bind::{Act, ActFormat};
use crate::defines::{defines, get_str, int_range, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{DeviceBuffer, Gpu, GpuError, Module};
use crate::kernel_family::Family;
use crate::problem::{matmul_of, Problem};
use crate::quant::GgmlType;
use crate::verdict::{CheckReport, Contract, Tolerance, POISON_BITS};
use crate::workload::{poison, OpKind, Workload};

pub struct QuantizeQ81;

impl Family for QuantizeQ81 {
    fn name(&self) -> &'static str {
        "quantize_q8_1"
    }
    fn entry(&self) -> &'static str {
        "quantize_q8_1"
    }
    fn source_file(&self) -> &'static str {
        "quantize_q8_1.cu"
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([("THREADS", 256i64)]);
        d.insert("OUT".into(), "Q8_1".into());
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Bitexact
    }
    fn default_tolerance(&self, _d: &Defines, _p: &Problem) -> Tolerance {
        Tolerance::bitexact()
    }
    /// Quantizes x[m][k] (the problem's n is ignored); k must be a multiple of 32.
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let mp = matmul_of(p)?;
        out_of(d)?;
        let threads = int_range(d, "THREADS", 32, lim.max_threads_per_block as i64)?;
        if threads % 32 != 0 {
            return Err(format!("THREADS={threads} is not a multiple of 32"));
        }
        if mp.k % 32 != 0 || mp.k == 0 || mp.m == 0 {
            return Err(format!(
                "m={} k={}: k must be a positive multiple of 32",
                mp.m, mp.k
            ));
        }
        let elems = (mp.m * mp.k) as u64;
        let blocks = (elems / 4).div_ceil(threads as u64);
        if blocks > i32::MAX as u64 {
            return Err("problem too large for a 1-D grid".into());
        }
        Ok(LaunchGeometry {
            kernel: "quantize_q8_1".into(),
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
        let mp = matmul_of(p).map_err(GpuError::Rejected)?;
        let mut rng = rng_for(self.name(), &[mp.m, mp.k], seed);
        let x = random_matrix(&mut rng, mp.m, mp.k);
        let format = out_of(d).map_err(GpuError::Rejected)?;
        let (want, ds) = match format {
            ActFormat::Q8Split => (Want::Split(q8_split_records(&x)), gpu.alloc(16)?),
            _ => {
                let (q, ds) = q8_1_replay(&x);
                (Want::Q8_1 { q, ds }, gpu.alloc(mp.m * mp.k / 32 * 8)?)
            }
        };
        Ok(Box::new(QuantWorkload {
            x: gpu.upload(&x)?,
            q: gpu.alloc(format.bytes(mp.m, mp.k))?,
            ds,
            format,
            want,
            xs: x,
            geo: geo.clone(),
        }))
    }
}

/// The format OUT names: Q8_1 planes or split Q8 records.
fn out_of(d: &Defines) -> Result<ActFormat, String> {
    match get_str(d, "OUT")?.as_str() {
        "Q8_1" => Ok(ActFormat::Q8_1),
        "Q8_SPLIT" => Ok(ActFormat::Q8Split),
        o => Err(format!("OUT={o}: quantize_q8_1 writes Q8_1 or Q8_SPLIT")),
    }
}

/// What the kernel must write: Q8_1 quants and (d, sum) pairs, or split
/// records, bit for bit.
enum Want {
    Q8_1 { q: Vec<i8>, ds: Vec<[f32; 2]> },
    Split(Vec<u8>),
}

/// One checked call in either format: `q` is the main plane (Q8_1 quants or
/// split records), `ds` the Q8_1 scale plane (unread with Q8_SPLIT).
struct QuantWorkload {
    x: DeviceBuffer,
    q: DeviceBuffer,
    ds: DeviceBuffer,
    format: ActFormat,
    want: Want,
    xs: Vec<f32>,
    geo: LaunchGeometry,
}

impl QuantWorkload {
    fn q8_1(&self) -> bool {
        matches!(self.want, Want::Q8_1 { .. })
    }
}

impl Workload for QuantWorkload {
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
        let out = Act {
            format: self.format,
            data: self.q.ptr(),
            scales: if self.q8_1() {
                self.ds.ptr()
            } else {
                crate::bind::NULL
            },
        };
        let args = Prepass::QuantizeQ8_1
            .kargs(self.x.ptr(), &out, 1, self.xs.len())
            .ok_or_else(|| GpuError::Other("quantize_q8_1 has no pre-pass arguments".into()))?;
        gpu.launch(m, &self.geo, &args)
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        if self.q8_1() {
            poison(gpu, &[&self.q, &self.ds])
        } else {
            poison(gpu, &[&self.q])
        }
    }
    fn evaluate(&self, gpu: &Gpu, _c: Contract, _tol: &Tolerance) -> Result<CheckReport, GpuError> {
        let qw: Vec<u32> = gpu.download(&self.q)?;
        let mut unwritten = qw.iter().filter(|&&w| w == POISON_BITS).count();
        let mut detail = Vec::new();
        // The dequantized GPU output (informative: how far it is from x),
        // the differing quants / pairs / records, and the ok message.
        let (vals, outliers, non_finite, ok) = match &self.want {
            Want::Q8_1 {
                q: want_q,
                ds: want_ds,
            } => {
                let dsw: Vec<f32> = gpu.download(&self.ds)?;
                let q: Vec<i8> = qw
                    .iter()
                    .flat_map(|w| w.to_le_bytes())
                    .map(|b| b as i8)
                    .collect();
                unwritten += dsw.iter().filter(|f| f.to_bits() == POISON_BITS).count();
                let non_finite = dsw
                    .iter()
                    .filter(|f| !f.is_finite() && f.to_bits() != POISON_BITS)
                    .count();
                let q_bad: Vec<usize> = (0..want_q.len()).filter(|&i| q[i] != want_q[i]).collect();
                let ds_bad: Vec<usize> = (0..want_ds.len())
                    .filter(|&b| {
                        dsw[2 * b].to_bits() != want_ds[b][0].to_bits()
                            || dsw[2 * b + 1].to_bits() != want_ds[b][1].to_bits()
                    })
                    .collect();
                if let Some(&i) = q_bad.first() {
                    detail.push(format!(
                        "{} quants differ (first at {i}: got {} want {})",
                        q_bad.len(),
                        q[i],
                        want_q[i]
                    ));
                }
                if let Some(&b) = ds_bad.first() {
                    detail.push(format!(
                        "{} (d, sum) pairs differ (first at block {b}: got ({}, {}) want ({}, {}))",
                        ds_bad.len(),
                        dsw[2 * b],
                        dsw[2 * b + 1],
                        want_ds[b][0],
                        want_ds[b][1]
                    ));
                }
                let vals: Vec<f64> = (0..self.xs.len())
                    .map(|i| q[i] as f64 * dsw[2 * (i / 32)] as f64)
                    .collect();
                let ok = format!(
                    "ok: {} quants and {} (d, sum) pairs bit-identical",
                    q.len(),
                    want_ds.len()
                );
                (vals, q_bad.len() + ds_bad.len(), non_finite, ok)
            }
            Want::Split(want) => {
                let got: Vec<u8> = qw.iter().flat_map(|w| w.to_le_bytes()).collect();
                let rec = super::Q8_SPLIT_RECORD;
                let groups = want.len() / rec;
                let bad: Vec<usize> = (0..groups)
                    .filter(|&g| got[g * rec..(g + 1) * rec] != want[g * rec..(g + 1) * rec])
                    .collect();
                if let Some(&g) = bad.first() {
                    detail.push(format!(
                        "{} of {groups} split records differ (first: group {g})",
                        bad.len()
                    ));
                }
                let vals = super::q8_split_values(&got, self.xs.len());
                let non_finite = vals.iter().filter(|v| !v.is_finite()).count();
                let ok = format!("ok: {groups} split records bit-identical");
                (vals, bad.len(), non_finite, ok)
            }
        };
        let (mut e2, mut r2, mut max_abs, mut max_rel) = (0f64, 0f64, 0f64, 0f64);
        for (&v, &xv) in vals.iter().zip(&self.xs) {
            let e = (v - xv as f64).abs();
            if e.is_finite() {
                e2 += e * e;
                max_abs = max_abs.max(e);
                max_rel = max_rel.max(e / (xv.abs() as f64).max(1e-30));
            }
            r2 += (xv as f64) * (xv as f64);
        }
        if unwritten > 0 {
            detail.push(format!("{unwritten} output words unwritten"));
        }
        Ok(CheckReport {
            passed: detail.is_empty(),
            rms_rel: (e2 / r2.max(f64::MIN_POSITIVE)).sqrt(),
            max_rel,
            max_abs,
            outliers,
            replay_rms_rel: Some(if outliers == 0 { 0.0 } else { 1.0 }),
            unwritten,
            non_finite,
            detail: if detail.is_empty() {
                ok
            } else {
                detail.join("; ")
            },
        })
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v: Vec<u32> = gpu.download(&self.q)?;
        if self.q8_1() {
            v.extend(gpu.download::<u32>(&self.ds)?);
        }
        Ok(v)
    }
    fn bytes_per_call(&self) -> u64 {
        let e = self.xs.len() as u64;
        let scales = if self.q8_1() { e / 32 * 8 } else { 0 };
        4 * e + self.format.bytes(1, self.xs.len()) as u64 + scales
    }
    fn ops_per_call(&self) -> u64 {
        self.xs.len() as u64
    }
    fn op_kind(&self) -> OpKind {
        OpKind::Flop
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_selects_the_format_and_refuses_the_rest() {
        let f = QuantizeQ81;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let p = Problem::matmul(2, 1, 2560, GgmlType::Q8_0);
        let mut d = f.default_defines(GgmlType::Q8_0);
        assert_eq!(out_of(&d), Ok(ActFormat::Q8_1));
        f.validate(&d, &p, &lim).expect("Q8_1");
        d.insert("OUT".into(), "Q8_SPLIT".into());
        assert_eq!(out_of(&d), Ok(ActFormat::Q8Split));
        f.validate(&d, &p, &lim).expect("split records");
        d.insert("OUT".into(), "F32".into());
        let e = f.validate(&d, &p, &lim).expect_err("not an integer format");
        assert!(e.contains("writes Q8_1 or Q8_SPLIT"), "{e}");
    }
}
