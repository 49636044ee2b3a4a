//! `attn_prefill`: attention of a prefill chunk over the layer's cache
//! (causal, optionally windowed), scalar or tensor-core flash kernel. See
//! kernels/cuda/attn_prefill.cu and `bind::attention`.

use super::attention::{self, Algo, Persist, PrefillIo};
use crate::bind::ActFormat;
use crate::compile::Arch;
use crate::defines::{defines, get_int, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{attn_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;

pub struct AttnPrefill;

impl Family for AttnPrefill {
    fn name(&self) -> &'static str {
        "attn_prefill"
    }
    fn entry(&self) -> &'static str {
        "attn_prefill"
    }
    fn source_file(&self) -> &'static str {
        "attn_prefill.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Attention
    }
    fn arch_specific_for(&self, d: &Defines) -> Option<Arch> {
        (get_int(d, "ALGO").ok() == Some(2)).then_some(attention::WGMMA_ARCH)
    }
    fn default_defines(&self, _wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("ALGO", 1i64),
            ("HEAD_DIM", 256),
            ("SCALAR_WARPS", 4),
            ("BQ", 32),
            ("BKV", 32),
            ("WD", 4),
            ("STAGES", 2),
            ("CP_ASYNC", 1),
            ("WINDOWED", 0),
            ("PERSIST", 0),
            ("Q16", 0),
            ("COUNT_TILES", 0),
        ]);
        d.insert("KV_TYPE".into(), "F16".into());
        d.insert("OUT".into(), "F32".into());
        d
    }
    fn contract(&self, d: &Defines) -> Contract {
        attention::contract(d)
    }
    fn default_tolerance(&self, d: &Defines, p: &Problem) -> Tolerance {
        attention::tolerance(d, p)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let a = attn_of(p)?;
        let algo = attention::read_prefill(d, a, lim)?;
        crate::defines::int_in(d, "WINDOWED", &[0, 1])?;
        crate::defines::int_in(d, "COUNT_TILES", &[0, 1])?;
        let io = PrefillIo::read(d)?;
        let persist = crate::defines::int_in(d, "PERSIST", &[0, 1, 2])?;
        match &algo {
            Algo::Mma(t) if t.wgmma => match t.persist {
                Persist::TwoQ if io.q16 => {
                    return Err("PERSIST=1 stages f32 Q; Q16=1 runs PERSIST=0 or 2".into())
                }
                Persist::OneQ if !io.q16 => {
                    return Err("PERSIST=2 copies the next Q as stored: it needs Q16=1".into())
                }
                Persist::OneQ if io.out != ActFormat::F32 && 2 * t.bkv < t.bq => {
                    return Err(format!(
                        "PERSIST=2 stages the {} O tile in the two V buffers: BKV={} holds {} of its BQ={} rows",
                        io.out.define(),
                        t.bkv,
                        2 * t.bkv,
                        t.bq
                    ))
                }
                _ => {}
            },
            _ => {
                if persist != 0 {
                    return Err(format!(
                        "PERSIST={persist} is the wgmma loop's schedule (ALGO=2)"
                    ));
                }
                if io != PrefillIo::F32 {
                    return Err(format!(
                        "Q16={} OUT={}: only the wgmma loop (ALGO=2) reads 16-bit Q or writes DQ",
                        io.q16 as u8,
                        io.out.define()
                    ));
                }
            }
        }
        if a.n_q > 65535 * 16 {
            return Err(format!("{} query tokens in one call", a.n_q));
        }
        Ok(attention::geometry("attn_prefill", &algo, a, 1, lim))
    }
    fn workload(
        &self,
        gpu: &Gpu,
        d: &Defines,
        p: &Problem,
        geo: &LaunchGeometry,
        seed: u64,
    ) -> Result<Box<dyn Workload>, GpuError> {
        let io = PrefillIo::read(d).map_err(GpuError::Rejected)?;
        let seq = self.launch_sequence(d).map_err(GpuError::Rejected)?;
        attention::workload(gpu, d, p, geo, seed, seq, io)
    }
}

/// The tile count a COUNT_TILES run of `d` on `p` must report (None for the
/// scalar kernel, which has no tiles).
pub fn expected_tiles(d: &Defines, p: &Problem, lim: &DeviceLimits) -> Option<u64> {
    let a = attn_of(p).ok()?;
    match attention::read_prefill(d, a, lim).ok()? {
        Algo::Mma(t) => Some(attention::visited_tiles(
            &t,
            a,
            get_int(d, "WINDOWED").ok()? == 1,
        )),
        Algo::Scalar { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compile::Arch;
    use crate::problem::{AttnProblem, KvType};

    /// E4B heads over a 512-token window, 4096 tokens: 256 work items.
    fn e4b_window_4096() -> Problem {
        Problem::Attention(AttnProblem {
            n_heads: 8,
            n_kv_heads: 2,
            head_dim: 256,
            window: 512,
            q_pos0: 0,
            n_q: 4096,
            capacity: 4096,
            kv_type: KvType::F16,
        })
    }

    #[test]
    fn the_persistent_schedule_is_the_wgmma_loops_only() {
        let f = AttnPrefill;
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = e4b_window_4096();
        let mut d = f.default_defines(GgmlType::F16);
        d.insert("PERSIST".into(), 1i64.into());
        let e = f.validate(&d, &p, &lim).unwrap_err();
        assert!(e.contains("ALGO=2"), "{e}");
        for (k, v) in [("ALGO", 2i64), ("BQ", 128), ("BKV", 32), ("WD", 1)] {
            d.insert(k.into(), v.into());
        }
        let g = f
            .validate(&d, &p, &lim)
            .expect("the persistent window tile");
        assert_eq!(g.grid, (132, 1, 1));
        d.insert("PERSIST".into(), 3i64.into());
        assert!(f.validate(&d, &p, &lim).is_err());
    }

    #[test]
    fn sixteen_bit_q_and_dq_out_are_the_wgmma_loops_and_fit_the_one_q_schedule() {
        let f = AttnPrefill;
        let lim = DeviceLimits::for_arch(Arch(90));
        let p = e4b_window_4096();
        let set = |d: &mut Defines, kv: &[(&str, i64)]| {
            for (k, v) in kv {
                d.insert(k.to_string(), (*v).into());
            }
        };
        // The mma.sync loop reads f32 Q and writes f32 O only.
        let mut d = f.default_defines(GgmlType::F16);
        set(&mut d, &[("Q16", 1)]);
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("ALGO=2"));
        let mut d = f.default_defines(GgmlType::F16);
        d.insert("OUT".into(), "DQ_F16".into());
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("ALGO=2"));
        // Attention never writes Q8_1.
        d.insert("OUT".into(), "Q8_1".into());
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("Q8_1"));
        // The one-Q-tile schedule: Q16 required, 64-key tiles fit with one
        // Q tile, and the DQ tile must fit the two V buffers.
        let mut d = f.default_defines(GgmlType::F16);
        set(
            &mut d,
            &[
                ("ALGO", 2),
                ("BQ", 128),
                ("BKV", 64),
                ("WD", 1),
                ("PERSIST", 2),
            ],
        );
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("Q16=1"));
        set(&mut d, &[("Q16", 1)]);
        d.insert("OUT".into(), "DQ_F16".into());
        let g = f
            .validate(&d, &p, &lim)
            .expect("the persistent 16-bit-Q tile");
        assert_eq!(g.grid, (132, 1, 1));
        assert_eq!(g.dyn_smem as usize, 1024 + 128 * 256 * 2 + 2 * 4 * 64 * 256);
        set(&mut d, &[("BKV", 32)]);
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("V buffers"));
        d.insert("OUT".into(), "F32".into());
        assert!(f.validate(&d, &p, &lim).is_ok());
        // The f32 staging ring and 16-bit Q do not mix.
        set(&mut d, &[("PERSIST", 1)]);
        assert!(f.validate(&d, &p, &lim).unwrap_err().contains("PERSIST=1"));
    }
}
