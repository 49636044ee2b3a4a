//! What the row-wise and attention families (rmsnorm, qk_norm_rope,
//! gelu_mul, embed, ple, softcap, attn_prefill, attn_decode) share: one workload shape (inputs, outputs, in-place buffers
//! restored before every checked run, a reference computed on demand), the
//! activation-format codecs of `act_out.cuh` on the CPU, and the checks of
//! their defines.

use crate::bind::ActFormat;
use crate::defines::{get_int, get_str, Defines};
use crate::device::LaunchGeometry;
use crate::gpu::{DeviceBuffer, Gpu, GpuError, KArg, Module};
use crate::quant::blocks::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use crate::verdict::{compare, CheckReport, Contract, Tolerance};
use crate::workload::{poison, OpKind, Workload};

/// The `OUT` define of a producer.
pub(crate) fn out_format(d: &Defines) -> Result<ActFormat, String> {
    let o = get_str(d, "OUT")?;
    ActFormat::from_define(&o)
        .ok_or_else(|| format!("OUT={o} is not F32, Q8_1, DQ_F16, DQ_BF16 or Q8_SPLIT"))
}

/// Width requirements of a row in format `f`.
pub(crate) fn check_out_width(f: ActFormat, width: usize) -> Result<(), String> {
    let unit = match f {
        ActFormat::F32 => 4,
        ActFormat::Q8_1 | ActFormat::Q8Split => 32,
        ActFormat::DqF16 | ActFormat::DqBf16 => 16,
    };
    if width == 0 || width % unit != 0 {
        return Err(format!(
            "width {width} is not a positive multiple of {unit} (needed by OUT={})",
            f.define()
        ));
    }
    Ok(())
}

/// THREADS in 32..=1024, a multiple of 32.
pub(crate) fn threads(d: &Defines) -> Result<usize, String> {
    let t = get_int(d, "THREADS")?;
    if !(32..=1024).contains(&t) || t % 32 != 0 {
        return Err(format!("THREADS={t} is not a multiple of 32 in 32..=1024"));
    }
    Ok(t as usize)
}

/// Values as a perfect producer of format `f` would leave them: quantized
/// (Q8_1) or rounded (DQ) and read back as f32, in row order.
pub(crate) fn act_replay(f: ActFormat, v: &[f32]) -> Vec<f32> {
    match f {
        ActFormat::F32 => v.to_vec(),
        ActFormat::Q8_1 => {
            let (q, ds) = super::q8_1_replay(v);
            q.iter()
                .enumerate()
                .map(|(i, &qi)| qi as f32 * ds[i / 32][0])
                .collect()
        }
        ActFormat::DqF16 => v.iter().map(|&x| f16_to_f32(f32_to_f16(x))).collect(),
        ActFormat::DqBf16 => v.iter().map(|&x| bf16_to_f32(f32_to_bf16(x))).collect(),
        ActFormat::Q8Split => super::split_q8_replay(v)
            .into_iter()
            .map(|x| x as f32)
            .collect(),
    }
}

/// The f32 values of an activation buffer written in format `f` (`data`
/// the main plane's words, `scales` the Q8_1 (d, sum) pairs), `n` values.
pub(crate) fn act_decode(f: ActFormat, data: &[u32], scales: &[f32], n: usize) -> Vec<f32> {
    match f {
        ActFormat::F32 => data[..n].iter().map(|&w| f32::from_bits(w)).collect(),
        ActFormat::Q8_1 => (0..n)
            .map(|i| {
                let q = (data[i / 4] >> (8 * (i % 4))) as u8 as i8;
                q as f32 * scales[2 * (i / 32)]
            })
            .collect(),
        ActFormat::DqF16 | ActFormat::DqBf16 => {
            let mut out = vec![0f32; n];
            for (g, words) in data.chunks(8).take(n / 16).enumerate() {
                for (p, &w) in words.iter().enumerate() {
                    // stored pair p holds actual pair [0,2,4,6,1,3,5,7][p]
                    let q = [0, 2, 4, 6, 1, 3, 5, 7][p];
                    let (lo, hi) = ((w & 0xffff) as u16, (w >> 16) as u16);
                    let cv = |b: u16| {
                        if f == ActFormat::DqF16 {
                            f16_to_f32(b)
                        } else {
                            bf16_to_f32(b)
                        }
                    };
                    out[g * 16 + 2 * q] = cv(lo);
                    out[g * 16 + 2 * q + 1] = cv(hi);
                }
            }
            out
        }
        ActFormat::Q8Split => {
            let bytes: Vec<u8> = data.iter().flat_map(|w| w.to_le_bytes()).collect();
            super::q8_split_values(&bytes, n)
                .into_iter()
                .map(|x| x as f32)
                .collect()
        }
    }
}

/// The tolerance of an output rounded to format `f` on top of an fp
/// computation bounded by `fp`.
pub(crate) fn format_tolerance(f: ActFormat, fp: f64) -> Tolerance {
    let (rms, max) = match f {
        ActFormat::F32 => (fp, 20.0 * fp),
        // Q8_1: a step of amax/127 per element, ~0.4% RMS for uniform data.
        ActFormat::Q8_1 => (1e-2, 5e-2),
        ActFormat::DqF16 => (4.0 * f64::powi(2.0, -11), 20.0 * f64::powi(2.0, -11)),
        ActFormat::DqBf16 => (4.0 * f64::powi(2.0, -8), 20.0 * f64::powi(2.0, -8)),
        // Split Q8: the residual's step is under amax / 127 / 254, about
        // 2e-5 of the RMS for uniform data, on top of the fp computation.
        ActFormat::Q8Split => (1e-4 + fp, 1e-3 + 20.0 * fp),
    };
    Tolerance {
        rms_rel: rms,
        max_rel: max,
        outlier_frac: if f == ActFormat::F32 { 0.0 } else { 1e-3 },
        // The replay rounds the CPU's f32 values; the kernel's differ by
        // f32 reduction order, which flips a rare rounding by one step.
        // A flipped first-plane step is absorbed by the second plane of
        // the split, which then differs by at most its own step.
        replay_rms_rel: match f {
            ActFormat::F32 => fp,
            ActFormat::Q8Split => 1e-4,
            _ => 2e-3,
        },
    }
}

/// How an output buffer is read back.
pub(crate) enum OutRead {
    /// f32 words.
    F32,
    /// An activation in format `f` with its scale buffer index, `n` values.
    Act {
        format: ActFormat,
        scales: Option<usize>,
        n: usize,
    },
    /// 16-bit values (K/V caches): f16 (`false`) or bf16 (`true`).
    Half { bf16: bool, n: usize },
}

pub(crate) type RowsRef = Box<dyn Fn() -> (Vec<f64>, Option<Vec<f64>>)>;

/// A row-wise family's runnable instance.
pub(crate) struct RowsWorkload {
    pub bufs: Vec<DeviceBuffer>,
    /// Buffers poisoned before a checked run and compared after it, in
    /// order (their values are concatenated).
    pub outputs: Vec<(usize, OutRead)>,
    /// In-place buffers: (buffer, pristine copy) restored before every
    /// checked run.
    pub restore: Vec<(usize, DeviceBuffer)>,
    pub args: Vec<KArg>,
    pub geo: LaunchGeometry,
    /// Launches of the same module that follow the main one (the split-KV
    /// combine of the decode attention), each a programmatic dependent of
    /// the launch before it (`Gpu::launch_dependent`): its kernel must wait
    /// for that grid (`griddepcontrol.wait`) before reading its output.
    pub then: Vec<(LaunchGeometry, Vec<KArg>)>,
    /// Whether the main launch is itself a programmatic dependent of the
    /// launch before it (the decode attention's split kernel, as
    /// `bind::attention::launch` enqueues it): back to back, a call's
    /// kernel may then start while the previous call's last launch drains.
    pub dependent: bool,
    /// Inputs rotated in the DRAM regime, as (buffer, argument) pairs: the
    /// argument points at the buffer in copy 0 and at its `copies` twin in
    /// copy i (the attention caches, which a decode step reads once, like
    /// weights).
    pub rotate: Vec<(usize, usize)>,
    /// Copies 1.. of the rotated buffers, in `rotate`'s order.
    pub copies: Vec<Vec<DeviceBuffer>>,
    pub reference: RowsRef,
    pub bytes: u64,
    pub ops: u64,
}

impl RowsWorkload {
    fn read(&self, gpu: &Gpu) -> Result<Vec<f32>, GpuError> {
        let mut out = Vec::new();
        for (i, how) in &self.outputs {
            let words: Vec<u32> = gpu.download(&self.bufs[*i])?;
            match how {
                OutRead::F32 => out.extend(words.iter().map(|&w| f32::from_bits(w))),
                OutRead::Act { format, scales, n } => {
                    let sc: Vec<f32> = match scales {
                        Some(s) => gpu.download(&self.bufs[*s])?,
                        None => Vec::new(),
                    };
                    out.extend(act_decode(*format, &words, &sc, *n));
                }
                OutRead::Half { bf16, n } => {
                    for i in 0..*n {
                        let b = (words[i / 2] >> (16 * (i % 2))) as u16;
                        out.push(if *bf16 { bf16_to_f32(b) } else { f16_to_f32(b) });
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Workload for RowsWorkload {
    fn weight_bytes(&self) -> u64 {
        self.rotate
            .iter()
            .map(|&(b, _)| self.bufs[b].bytes() as u64)
            .sum()
    }
    fn set_weight_copies(&mut self, gpu: &Gpu, n: usize) -> Result<(), GpuError> {
        self.copies.truncate(n.saturating_sub(1));
        while self.copies.len() + 1 < n {
            let mut copy = Vec::with_capacity(self.rotate.len());
            for &(b, _) in &self.rotate {
                let c = gpu.alloc(self.bufs[b].bytes())?;
                gpu.copy(&c, &self.bufs[b])?;
                copy.push(c);
            }
            self.copies.push(copy);
        }
        Ok(())
    }
    fn weight_copies(&self) -> usize {
        self.copies.len() + 1
    }
    fn launch(&self, gpu: &Gpu, m: &Module, copy: usize) -> Result<(), GpuError> {
        let main = |args: &[KArg]| {
            if self.dependent {
                gpu.launch_dependent(m, &self.geo, args)
            } else {
                gpu.launch(m, &self.geo, args)
            }
        };
        if copy == 0 || self.rotate.is_empty() {
            main(&self.args)?;
        } else {
            let mut args = self.args.clone();
            for (&(_, a), c) in self.rotate.iter().zip(&self.copies[copy - 1]) {
                args[a] = c.arg();
            }
            main(&args)?;
        }
        for (g, a) in &self.then {
            gpu.launch_dependent(m, g, a)?;
        }
        Ok(())
    }
    fn poison(&self, gpu: &Gpu) -> Result<(), GpuError> {
        for (i, pristine) in &self.restore {
            gpu.copy(&self.bufs[*i], pristine)?;
        }
        let outs: Vec<&DeviceBuffer> = self
            .outputs
            .iter()
            .filter(|(i, _)| !self.restore.iter().any(|(r, _)| r == i))
            .map(|(i, _)| &self.bufs[*i])
            .collect();
        poison(gpu, &outs)
    }
    fn evaluate(
        &self,
        gpu: &Gpu,
        contract: Contract,
        tol: &Tolerance,
    ) -> Result<CheckReport, GpuError> {
        let out = self.read(gpu)?;
        let (reference, replay) = (self.reference)();
        Ok(compare(
            &out[..reference.len().min(out.len())],
            &reference,
            replay.as_deref(),
            contract,
            tol,
        ))
    }
    fn raw_output(&self, gpu: &Gpu) -> Result<Vec<u32>, GpuError> {
        let mut v = Vec::new();
        for (i, _) in &self.outputs {
            v.extend(gpu.download::<u32>(&self.bufs[*i])?);
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

/// f64 copies for references.
pub(crate) fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dq_decode_inverts_the_permuted_layout() {
        // Write 16 values the way act_out.cuh does for DQ_F16 and read back.
        let v: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 3.0).collect();
        let mut words = vec![0u32; 16];
        for e in (0..32).step_by(4) {
            let base = (e & !15) / 2;
            let q0 = (e % 16) / 2;
            let pack = |a: f32, b: f32| f32_to_f16(a) as u32 | ((f32_to_f16(b) as u32) << 16);
            words[base + q0 / 2] = pack(v[e], v[e + 1]);
            words[base + q0 / 2 + 4] = pack(v[e + 2], v[e + 3]);
        }
        assert_eq!(act_decode(ActFormat::DqF16, &words, &[], 32), v);
    }

    #[test]
    fn q8_split_decode_matches_the_replay() {
        let v: Vec<f32> = (0..96)
            .map(|i| ((i * 53 % 96) as f32 - 41.0) * 0.037)
            .collect();
        let words: Vec<u32> = super::super::q8_split_records(&v)
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let got = act_decode(ActFormat::Q8Split, &words, &[], 96);
        assert_eq!(got, act_replay(ActFormat::Q8Split, &v));
        // About 15 bits: every value within amax / 127 / 254 of x.
        let amax = v.iter().fold(0f32, |a, x| a.max(x.abs()));
        for (g, x) in got.iter().zip(&v) {
            assert!((g - x).abs() <= amax / 127.0 / 254.0 * 1.01, "{x} -> {g}");
        }
        assert!(check_out_width(ActFormat::Q8Split, 48).is_err());
    }

    #[test]
    fn q8_1_decode_matches_the_replay() {
        let v: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 64) as f32 - 30.0) * 0.1)
            .collect();
        let (q, ds) = super::super::q8_1_replay(&v);
        let words: Vec<u32> = q
            .chunks(4)
            .map(|c| u32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]))
            .collect();
        let sc: Vec<f32> = ds.iter().flat_map(|p| [p[0], p[1]]).collect();
        assert_eq!(
            act_decode(ActFormat::Q8_1, &words, &sc, 64),
            act_replay(ActFormat::Q8_1, &v)
        );
    }
}
