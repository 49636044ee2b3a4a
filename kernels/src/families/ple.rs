//! `ple`: the per-layer inputs of E2B/E4B on the GPU (PLE table gather,
//! chunk norm of the model projection, sum, 1/sqrt 2). See
//! kernels/cuda/ple.cu and `bind::rows::PleArgs`. The shape's width is
//! `n_layers * P` and its aux is P.

use super::embed::{make_table, make_tokens, table_type, CHECK_VOCAB};
use super::rows_common::{threads, OutRead, RowsWorkload};
use super::{random_matrix, rng_for};
use crate::bind::rows::PleArgs;
use crate::defines::{defines, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::GgmlType;
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;
use rand::Rng;

pub struct Ple;

const EPS: f32 = 1e-6;

impl Family for Ple {
    fn name(&self) -> &'static str {
        "ple"
    }
    fn entry(&self) -> &'static str {
        "ple"
    }
    fn source_file(&self) -> &'static str {
        "ple.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([("THREADS", 128i64)]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Fp
    }
    fn default_tolerance(&self, _d: &Defines, p: &Problem) -> Tolerance {
        let pd = rows_of(p).map(|r| r.aux.max(1)).unwrap_or(256);
        let fp = 8.0 * super::gemv::fp_rms_bound(pd);
        Tolerance::fp(fp)
    }
    fn validate(
        &self,
        d: &Defines,
        p: &Problem,
        _lim: &DeviceLimits,
    ) -> Result<LaunchGeometry, String> {
        let r = rows_of(p)?;
        let t = table_type(d, r.dtype)?;
        let th = threads(d)?;
        let pd = r.aux;
        if pd == 0 || r.width % pd != 0 {
            return Err(format!(
                "width {} is not a whole number of PLE chunks of aux = {pd}",
                r.width
            ));
        }
        if pd > 4 * th {
            return Err(format!("P = {pd} exceeds 4 x THREADS = {}", 4 * th));
        }
        if r.width % t.block_size() != 0 {
            return Err(format!(
                "table rows of {} are not whole {} blocks",
                r.width,
                t.name()
            ));
        }
        if r.rows == 0 || r.rows > 65535 {
            return Err(format!("{} rows (grid.y holds 1..=65535)", r.rows));
        }
        Ok(LaunchGeometry {
            kernel: "ple".into(),
            grid: ((r.width / pd) as u32, r.rows as u32, 1),
            block: (th as u32, 1, 1),
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
        let r = rows_of(p).map_err(GpuError::Rejected)?;
        let t = table_type(d, r.dtype).map_err(GpuError::Rejected)?;
        let (rows, lp, pd) = (r.rows, r.width, r.aux);
        let mut rng = rng_for(self.name(), &[rows, lp, pd, t as usize], seed);
        let (bytes, deq) = make_table(&mut rng, t, CHECK_VOCAB, lp)?;
        let tokens = make_tokens(&mut rng, rows, CHECK_VOCAB);
        let proj = random_matrix(&mut rng, rows, lp);
        let norm: Vec<f32> = (0..pd).map(|_| rng.random_range(0.5f32..1.5)).collect();
        let d_model = 2560usize;
        let (proj_scale, tok_scale) = (1.0 / (d_model as f32).sqrt(), (pd as f32).sqrt());
        let mut want = Vec::with_capacity(rows * lp);
        for (i, &tok) in tokens.iter().enumerate() {
            for chunk in 0..lp / pd {
                let base = i * lp + chunk * pd;
                let v: Vec<f64> = proj[base..base + pd]
                    .iter()
                    .map(|&x| (x * proj_scale) as f64)
                    .collect();
                let ss: f64 = v.iter().map(|x| x * x).sum();
                let inv = 1.0 / (ss / pd as f64 + EPS as f64).sqrt();
                for j in 0..pd {
                    let e = deq[tok as usize * lp + chunk * pd + j] as f64 * tok_scale as f64;
                    want.push((v[j] * inv * norm[j] as f64 + e) * std::f64::consts::FRAC_1_SQRT_2);
                }
            }
        }
        let table = gpu.upload(&bytes)?;
        let tok = gpu.upload(&tokens)?;
        let pr = gpu.upload(&proj)?;
        let nb = gpu.upload(&norm)?;
        let out = gpu.alloc(rows * lp * 4)?;
        let a = PleArgs {
            tokens: tok.ptr(),
            table: table.ptr(),
            proj: pr.ptr(),
            proj_norm: nb.ptr(),
            out: out.ptr(),
            rows,
            n_layers: lp / pd,
            ple_dim: pd,
            proj_scale,
            tok_scale,
            eps: EPS,
        };
        let row_bytes = bytes.len() / CHECK_VOCAB;
        Ok(Box::new(RowsWorkload {
            args: a.kargs(),
            bufs: vec![tok, table, pr, nb, out],
            outputs: vec![(4, OutRead::F32)],
            restore: Vec::new(),
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (want.clone(), None)),
            bytes: (rows * (row_bytes + 8 * lp)) as u64,
            ops: (6 * rows * lp) as u64,
        }))
    }
}
