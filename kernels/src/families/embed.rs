//! `embed`: the token-embedding gather with on-device dequantization, and
//! the table handling it shares with `ple`. See kernels/cuda/embed.cu and
//! `bind::rows::EmbedArgs`.

use super::rows_common::{threads, OutRead, RowsWorkload};
use super::{random_matrix, rng_for};
use crate::bind::rows::EmbedArgs;
use crate::defines::{defines, get_int, get_str, Defines};
use crate::device::{DeviceLimits, LaunchGeometry};
use crate::gpu::{Gpu, GpuError};
use crate::kernel_family::Family;
use crate::problem::{rows_of, Problem, ProblemKind};
use crate::quant::repack::{repack_kquant, KSide};
use crate::quant::{dequantize_row, quantize_row, GgmlType};
use crate::verdict::{Contract, Tolerance};
use crate::workload::Workload;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

pub struct Embed;

/// Table types the gathers read as they are (gather.cuh).
pub const TABLE_TYPES: &[GgmlType] = &[
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q6K,
    GgmlType::F16,
    GgmlType::Bf16,
    GgmlType::F32,
];

/// The WTYPE define names the table type, checked against the shape's.
pub(crate) fn table_type(d: &Defines, shape: GgmlType) -> Result<GgmlType, String> {
    let w = get_str(d, "WTYPE")?;
    let t = GgmlType::from_name(&w.to_ascii_lowercase())
        .ok_or_else(|| format!("WTYPE={w} is not a ggml type"))?;
    if !TABLE_TYPES.contains(&t) {
        return Err(format!(
            "WTYPE={w}: the gathers read Q8_0, Q4_0, Q6_K, F16, BF16 and F32 tables"
        ));
    }
    if t != shape {
        return Err(format!(
            "WTYPE={w} does not match the shape's table type {}",
            shape.name()
        ));
    }
    Ok(t)
}

/// Rows of a seeded table: its GGUF bytes and exact values.
pub(crate) fn make_table(
    rng: &mut ChaCha8Rng,
    t: GgmlType,
    rows: usize,
    width: usize,
) -> Result<(Vec<u8>, Vec<f32>), GpuError> {
    let f = random_matrix(rng, rows, width);
    let rb = t
        .row_bytes(width as u64)
        .ok_or_else(|| GpuError::Rejected(format!("{width} is not whole {} blocks", t.name())))?
        as usize;
    let mut bytes = vec![0u8; rows * rb];
    let mut deq = vec![0f32; rows * width];
    for i in 0..rows {
        let (src, dst) = (
            &f[i * width..(i + 1) * width],
            &mut bytes[i * rb..(i + 1) * rb],
        );
        quantize_row(t, src, dst).map_err(|e| GpuError::Other(format!("table: {e}")))?;
        dequantize_row(t, dst, &mut deq[i * width..(i + 1) * width])
            .map_err(|e| GpuError::Other(format!("table: {e}")))?;
    }
    Ok((bytes, deq))
}

/// Token ids into a table of `vocab` rows: the first and last rows always,
/// the rest random.
pub(crate) fn make_tokens(rng: &mut ChaCha8Rng, rows: usize, vocab: usize) -> Vec<i32> {
    (0..rows)
        .map(|i| match i {
            0 => (vocab - 1) as i32,
            1 => 0,
            _ => rng.random_range(0..vocab as i32),
        })
        .collect()
}

/// Rows of the synthetic table a check gathers from.
pub(crate) const CHECK_VOCAB: usize = 97;

impl Family for Embed {
    fn name(&self) -> &'static str {
        "embed"
    }
    fn entry(&self) -> &'static str {
        "embed"
    }
    fn source_file(&self) -> &'static str {
        "embed.cu"
    }
    fn problem_kind(&self) -> ProblemKind {
        ProblemKind::Rows
    }
    fn default_defines(&self, wtype: GgmlType) -> Defines {
        let mut d = defines([
            ("THREADS", 256i64),
            ("ALGO", 0),
            ("UNROLL", 1),
            ("ROWS", 1),
            ("LAYOUT", 0),
        ]);
        d.insert("WTYPE".into(), crate::problem::wtype_define(wtype));
        d
    }
    fn contract(&self, _d: &Defines) -> Contract {
        Contract::Bitexact
    }
    fn default_tolerance(&self, _d: &Defines, _p: &Problem) -> Tolerance {
        Tolerance::bitexact()
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
        if r.width == 0 || r.width % t.block_size() != 0 {
            return Err(format!(
                "width {} is not whole {} blocks of {}",
                r.width,
                t.name(),
                t.block_size()
            ));
        }
        if r.rows == 0 || r.rows > 65535 {
            return Err(format!("{} rows (grid.y holds 1..=65535)", r.rows));
        }
        if crate::defines::int_in(d, "LAYOUT", &[0, 1])? == 1 && t != GgmlType::Q6K {
            return Err(format!(
                "LAYOUT=1 reads the Q6_K plane repack, not a {} table",
                t.name()
            ));
        }
        let grid = match get_int(d, "ALGO")? {
            0 => (r.width.div_ceil(th) as u32, r.rows as u32, 1),
            1 => {
                let unroll = get_int(d, "UNROLL")?;
                let rows = get_int(d, "ROWS")?;
                if !(1..=16).contains(&unroll) {
                    return Err(format!("UNROLL={unroll} is not in 1..=16"));
                }
                if !(1..=8).contains(&rows) {
                    return Err(format!("ROWS={rows} is not in 1..=8"));
                }
                // float4 stores of whole groups of four values.
                if r.width % 4 != 0 {
                    return Err(format!("ALGO=1 needs width % 4 == 0, not {}", r.width));
                }
                (1, r.rows.div_ceil(rows as usize) as u32, 1)
            }
            a => return Err(format!("ALGO={a} is not 0 or 1")),
        };
        Ok(LaunchGeometry {
            kernel: "embed".into(),
            grid,
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
        let (rows, w) = (r.rows, r.width);
        let mut rng = rng_for(self.name(), &[rows, w, t as usize], seed);
        let (bytes, deq) = make_table(&mut rng, t, CHECK_VOCAB, w)?;
        let tokens = make_tokens(&mut rng, rows, CHECK_VOCAB);
        let scale = (w as f32).sqrt();
        let mut want = Vec::with_capacity(rows * w);
        for &tok in &tokens {
            want.extend(
                deq[tok as usize * w..(tok as usize + 1) * w]
                    .iter()
                    .map(|&v| (v * scale) as f64),
            );
        }
        // LAYOUT=1: the table as the k-quant GEMV reads it (nibble plane
        // and side records), repacked losslessly from the same GGUF rows.
        let planes = get_int(d, "LAYOUT").map_err(GpuError::Rejected)? == 1;
        let (main, side) = if planes {
            let p = repack_kquant(t, &bytes, CHECK_VOCAB * w, KSide::Gemv)
                .map_err(|e| GpuError::Other(format!("table repack: {e}")))?;
            (p.nibbles, p.side)
        } else {
            (bytes, vec![0u8; 16])
        };
        let table_bytes = main.len() + if planes { side.len() } else { 0 };
        let table = gpu.upload(&main)?;
        let side = gpu.upload(&side)?;
        let tok = gpu.upload(&tokens)?;
        let out = gpu.alloc(rows * w * 4)?;
        let a = EmbedArgs {
            tokens: tok.ptr(),
            table: table.ptr(),
            side: if planes {
                side.ptr()
            } else {
                crate::bind::NULL
            },
            out: out.ptr(),
            rows,
            width: w,
            scale,
        };
        let row_bytes = table_bytes / CHECK_VOCAB;
        Ok(Box::new(RowsWorkload {
            args: a.kargs(),
            bufs: vec![tok, table, out, side],
            outputs: vec![(2, OutRead::F32)],
            restore: Vec::new(),
            geo: geo.clone(),
            then: Vec::new(),
            dependent: false,
            rotate: Vec::new(),
            copies: Vec::new(),
            reference: Box::new(move || (want.clone(), None)),
            bytes: (rows * (row_bytes + 4 * w + 4)) as u64,
            ops: (rows * w) as u64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::blocks::f16_to_f32;

    /// embed.cu's LAYOUT=1 read replayed on the CPU with the kernel's byte
    /// offsets and word loads (`q6p_ld4` / `q6p_deq4`): every value of
    /// every row of a repacked Q6_K table equals ggml's dequantization bit
    /// for bit.
    #[test]
    fn q6k_plane_reads_match_the_dequantized_rows() {
        let (vocab, width) = (5, 512);
        let mut rng = rng_for("embed-q6k-planes", &[vocab, width], 1);
        let (bytes, deq) = make_table(&mut rng, GgmlType::Q6K, vocab, width).expect("table");
        let p = repack_kquant(GgmlType::Q6K, &bytes, vocab * width, KSide::Gemv).expect("repack");
        let word =
            |b: &[u8], at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        for tok in 0..vocab {
            let nib_row = &p.nibbles[tok * width / 2..(tok + 1) * width / 2];
            let rec_row = &p.side[tok * (width / 256) * 88..(tok + 1) * (width / 256) * 88];
            for c in (0..width).step_by(4) {
                let (g, e) = (c >> 5, c & 31);
                let (j, half, t) = (g & 7, e >> 4, (e & 15) >> 2);
                let rec = &rec_row[(c >> 8) * 88..(c >> 8) * 88 + 88];
                let nib = word(nib_row, 16 * g + (e & 15));
                let high = word(rec, 8 * j + 4 * half);
                let sc = rec[64 + 2 * j + half] as i8;
                let d = u16::from_le_bytes([rec[80], rec[81]]);
                let ds = f16_to_f32(d) * sc as f32;
                let lo = if half == 1 { nib >> 4 } else { nib };
                let q = (lo & 0x0F0F_0F0F) | (((high >> (2 * t)) & 0x0303_0303) << 4);
                for b in 0..4 {
                    let v = ds * (((q >> (8 * b)) & 0xff) as i32 - 32) as f32;
                    let want = deq[tok * width + c + b];
                    assert_eq!(
                        v.to_bits(),
                        want.to_bits(),
                        "row {tok} element {}: {v} vs {want}",
                        c + b
                    );
                }
            }
        }
    }

    #[test]
    fn planes_are_read_for_q6k_tables_only() {
        let f = Embed;
        let lim = DeviceLimits::for_arch(crate::compile::Arch(90));
        let p = |t: GgmlType| {
            Problem::Rows(crate::problem::RowsProblem {
                rows: 3,
                width: 2560,
                dtype: t,
                aux: 0,
            })
        };
        let mut d = f.default_defines(GgmlType::Q6K);
        d.insert("LAYOUT".into(), 1i64.into());
        f.validate(&d, &p(GgmlType::Q6K), &lim)
            .expect("Q6_K planes");
        let mut d = f.default_defines(GgmlType::Q8_0);
        d.insert("LAYOUT".into(), 1i64.into());
        let e = f
            .validate(&d, &p(GgmlType::Q8_0), &lim)
            .expect_err("Q8_0 has no planes here");
        assert!(e.contains("Q6_K plane repack"), "{e}");
    }
}
