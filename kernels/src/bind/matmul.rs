//! Calling convention of the matmul families: `y[m][n] = sum_k x[m][k] *
//! W[n][k]` with y f32 `[m][n]`.
//!
//! `MatmulBinding::of(family, defines)` says, for one variant, how its
//! weights must be laid out in device memory, which activation format it
//! reads (and so which pre-pass produces it), whether `y` must be zeroed
//! before every call, and how many weight matrices it takes (the fused
//! gate+up GEMV takes two). `MatmulBinding::kargs` builds the parameter list
//! of the main kernel; `prepass_kargs` those of the pre-pass.

use super::{i32_arg, ptr, Act, ActFormat, DevPtr, NULL};
use crate::defines::{get_int, get_str, Defines};
use crate::gpu::KArg;
use crate::problem::WType;
use crate::quant::repack::{self, KSide};
use crate::quant::QuantError;

/// How a weight matrix `[n][k]` sits in device memory
/// (`MatmulBinding::device_weights` builds it, `row_strides` gives its
/// row pitch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// GGUF blocks as in the file (Q8_0: 34 bytes, Q4_0: 18 bytes per 32,
    /// Q6_K: 210 bytes per 256; F16/BF16: the values).
    GgufBlocks,
    /// A quant plane (`[n][k]` int8 for Q8_0, `[n][k/2]` nibbles in GGUF
    /// block order for Q4_0) and a scale plane `[n][k/32]` in `scales`.
    /// For the k-quants (`quant::repack`): the nibble plane and the GEMV
    /// side records (`ScaleType::F16`, the compact form the GEMV reads) or
    /// the GEMM side words (`ScaleType::F32`). F16/BF16 have no planes:
    /// their values are read as they are.
    Planes { scales: ScaleType },
}

/// Element type of a scale plane; for the k-quants, which side plane
/// (F16: the GEMV's compact records, F32: the GEMMs' f32 words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F16,
    F32,
}

/// Device addresses of one weight matrix in its layout: `q` is the GGUF
/// blocks or the quant plane, `d` the scale plane (`NULL` for blocks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Weights {
    pub q: DevPtr,
    pub d: DevPtr,
}

/// The matmul families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulFamily {
    Gemv,
    Mmq,
    GemmDq,
    GemmWgmma,
}

impl MatmulFamily {
    pub fn from_name(name: &str) -> Option<MatmulFamily> {
        match name {
            "gemv" => Some(MatmulFamily::Gemv),
            "mmq" => Some(MatmulFamily::Mmq),
            "gemm_dq" => Some(MatmulFamily::GemmDq),
            "gemm_wgmma" => Some(MatmulFamily::GemmWgmma),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            MatmulFamily::Gemv => "gemv",
            MatmulFamily::Mmq => "mmq",
            MatmulFamily::GemmDq => "gemm_dq",
            MatmulFamily::GemmWgmma => "gemm_wgmma",
        }
    }
}

/// The pre-pass that turns f32 activations into what a variant reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prepass {
    /// None: the kernel reads f32 activations.
    None,
    /// `quantize_q8_1` (its own family and module), writing the binding's
    /// activation format (its `OUT`: Q8_1 planes, or split Q8 records with
    /// no scale plane): `(x, q, ds, m*k as u64)`.
    QuantizeQ8_1,
    /// `gemm_dq_convert`, an entry of the variant's own module:
    /// `(x, xh, m*k/2 as u64)`.
    DqConvert,
}

impl Prepass {
    /// The pre-pass parameters turning f32 `x` (`[m][k]`, contiguous) into
    /// `out`; `None` when there is no pre-pass.
    /// `quantize_q8_1(x, q, ds, m*k)`, `gemm_dq_convert(x, xh, m*k/2)`.
    pub fn kargs(self, x: DevPtr, out: &Act, m: usize, k: usize) -> Option<Vec<KArg>> {
        match self {
            Prepass::None => None,
            Prepass::QuantizeQ8_1 => Some(vec![
                ptr(x),
                ptr(out.data),
                ptr(out.scales),
                KArg::U64((m * k) as u64),
            ]),
            Prepass::DqConvert => Some(vec![ptr(x), ptr(out.data), KArg::U64((m * k / 2) as u64)]),
        }
    }
}

/// The output format of a gemv variant: its `OUT` define, F32 or
/// Q8_SPLIT (absent in tables written before the define: F32).
pub fn gemv_out(d: &Defines) -> Result<ActFormat, String> {
    match d.get("OUT").map(|v| v.to_string()) {
        None => Ok(ActFormat::F32),
        Some(o) => match ActFormat::from_define(&o) {
            Some(f @ (ActFormat::F32 | ActFormat::Q8Split)) => Ok(f),
            _ => Err(format!("OUT={o} is not F32 or Q8_SPLIT")),
        },
    }
}

/// What a gemv variant does after its product in the grid's last block
/// (`TAIL`, `TAIL_OUT`; kernels/cuda/sandwich_tail.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TailMode {
    /// Nothing (TAIL=0).
    None,
    /// The residual add only: `h = (h + rmsnorm(y) * w_add) * s`
    /// (TAIL=1, TAIL_OUT=NONE).
    Residual,
    /// The residual add, then `rmsnorm(h) * w_out` in this format, the
    /// next projection's input (TAIL=1, TAIL_OUT=F32 | Q8_1 | Q8_SPLIT).
    Norm(ActFormat),
}

/// A gemv variant's tail (absent defines, in tables written before them:
/// none).
pub fn gemv_tail(d: &Defines) -> Result<TailMode, String> {
    let on = match d.get("TAIL") {
        None => false,
        Some(_) => get_int(d, "TAIL")? == 1,
    };
    let out = d.get("TAIL_OUT").map(|v| v.to_string());
    match (on, out.as_deref()) {
        (false, None | Some("NONE")) => Ok(TailMode::None),
        (false, Some(o)) => Err(format!(
            "TAIL_OUT={o} names the tail's output: it needs TAIL=1"
        )),
        (true, None | Some("NONE")) => Ok(TailMode::Residual),
        (true, Some(o)) => match ActFormat::from_define(o) {
            Some(f @ (ActFormat::F32 | ActFormat::Q8_1 | ActFormat::Q8Split)) => {
                Ok(TailMode::Norm(f))
            }
            _ => Err(format!("TAIL_OUT={o} is not NONE, F32, Q8_1 or Q8_SPLIT")),
        },
    }
}

/// The operands of a gemv TAIL=1 binding's sandwich-norm step over its
/// output rows `y` (`[m][n]` f32): `h_out = (h_in + rmsnorm(y) * w_add) *
/// *scale` (`scale` NULL: 1) and, with `TailMode::Norm`, `out =
/// rmsnorm(h_out) * w_out` (`w_out` NULL: weightless) in `out.format`.
/// `h_in` and `h_out` may be one buffer (in place). `scratch` holds at
/// least `tail_scratch_bytes(grid, m)`: its first u32 is the blocks'
/// arrival counter, 0 before the launch and left 0 by the kernel, then the
/// blocks' partial sums. Launches sharing one scratch must not overlap
/// (one stream).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tail {
    pub h_in: DevPtr,
    pub h_out: DevPtr,
    pub w_add: DevPtr,
    pub scale: DevPtr,
    pub w_out: DevPtr,
    pub out: Act,
    pub scratch: DevPtr,
    pub eps: f32,
}

/// Bytes of a gemv TAIL=1 launch's scratch over `grid` blocks at `m`
/// tokens: the u32 arrival counter (16 bytes, keeping the partials
/// aligned) and each block's sum of squares of its outputs per token
/// (kernels/cuda/sandwich_tail.cuh, TAIL_PARTIALS).
pub fn tail_scratch_bytes(grid: usize, m: usize) -> usize {
    16 + 4 * grid * m
}

/// The operands some bindings take beside weights, input and output.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Extra {
    /// gemv FUSE=2's side operand.
    pub side: Option<Side>,
    /// gemv TAIL=1's sandwich-norm operands.
    pub tail: Option<Tail>,
}

/// The f32 operand a gemv FUSE=2 multiplies `gelu_tanh(W x)` by: token
/// t's row at `ptr + 4 * t * stride` bytes, `n` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Side {
    pub ptr: DevPtr,
    /// Row stride in values.
    pub stride: usize,
}

/// One matmul variant's calling convention.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MatmulBinding {
    pub family: MatmulFamily,
    pub layout: WeightLayout,
    pub act: ActFormat,
    pub prepass: Prepass,
    /// The kernel adds into `y` (split-K): zero it before every call.
    pub zero_output: bool,
    /// Weight matrices per call: 2 for the fused gate+up GEMV, which
    /// writes `gelu_tanh(W0 x) * (W1 x)`.
    pub matrices: usize,
    /// The GEMV multiplies `gelu_tanh(W x)` by a given f32 operand (gemv
    /// FUSE=2: the PLE gate times the layer's per-layer input), passed as
    /// a `Side` in `kargs_with`'s `Extra`.
    pub side: bool,
    /// The format `y` is written in: f32 `[m][n]`, or (gemv OUT=Q8_SPLIT)
    /// the split Q8 records `[m][n / 32]` the next GEMV reads with ALGO 3.
    pub out: ActFormat,
    /// The step the last block runs over `y` (gemv TAIL), passed as a
    /// `Tail` in `Extra`.
    pub tail: TailMode,
}

impl MatmulBinding {
    /// The binding of `family` with `defines` (the variant's full defines).
    pub fn of(family: &str, d: &Defines) -> Result<MatmulBinding, String> {
        let fam = MatmulFamily::from_name(family)
            .ok_or_else(|| format!("{family} is not a matmul family"))?;
        let dq_act = || -> Result<ActFormat, String> {
            match get_str(d, "DQ_TYPE")?.as_str() {
                "F16" => Ok(ActFormat::DqF16),
                "BF16" => Ok(ActFormat::DqBf16),
                o => Err(format!("DQ_TYPE={o} is not F16 or BF16")),
            }
        };
        Ok(match fam {
            MatmulFamily::Gemv => {
                // ALGO 1 reads Q8_1 planes, ALGO 3 split Q8 records, both
                // from the quantize pre-pass (or a producer writing them);
                // ALGO 0 and 2 read the f32 rows.
                let act = match get_int(d, "ALGO")? {
                    1 => ActFormat::Q8_1,
                    3 => ActFormat::Q8Split,
                    _ => ActFormat::F32,
                };
                MatmulBinding {
                    family: fam,
                    layout: if get_int(d, "LAYOUT")? == 0 {
                        WeightLayout::GgufBlocks
                    } else {
                        WeightLayout::Planes {
                            scales: ScaleType::F16,
                        }
                    },
                    act,
                    prepass: if act == ActFormat::F32 {
                        Prepass::None
                    } else {
                        Prepass::QuantizeQ8_1
                    },
                    zero_output: false,
                    matrices: if get_int(d, "FUSE")? == 1 { 2 } else { 1 },
                    side: get_int(d, "FUSE")? == 2,
                    out: gemv_out(d)?,
                    tail: gemv_tail(d)?,
                }
            }
            MatmulFamily::Mmq => MatmulBinding {
                family: fam,
                layout: WeightLayout::Planes {
                    scales: ScaleType::F32,
                },
                act: ActFormat::Q8_1,
                prepass: Prepass::QuantizeQ8_1,
                zero_output: false,
                matrices: 1,
                side: false,
                out: ActFormat::F32,
                tail: TailMode::None,
            },
            MatmulFamily::GemmDq => MatmulBinding {
                family: fam,
                layout: WeightLayout::Planes {
                    scales: ScaleType::F32,
                },
                act: dq_act()?,
                prepass: Prepass::DqConvert,
                zero_output: false,
                matrices: 1,
                side: false,
                out: ActFormat::F32,
                tail: TailMode::None,
            },
            MatmulFamily::GemmWgmma => MatmulBinding {
                family: fam,
                layout: WeightLayout::Planes {
                    scales: ScaleType::F32,
                },
                act: dq_act()?,
                prepass: Prepass::DqConvert,
                zero_output: get_int(d, "KSPLIT")? > 1,
                matrices: 1,
                side: false,
                out: ActFormat::F32,
                tail: TailMode::None,
            },
        })
    }

    /// The main kernel's parameters. `w` holds `self.matrices` weights; `x`
    /// is in `self.act`. A binding with a side operand (`self.side`) or a
    /// tail (`self.tail`) needs `kargs_with`.
    pub fn kargs(
        &self,
        w: &[Weights],
        x: &Act,
        y: DevPtr,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<Vec<KArg>, String> {
        self.kargs_with(w, x, y, m, n, k, Extra::default())
    }

    /// `kargs` with the extra operands: the side operand of a gemv FUSE=2
    /// binding, the sandwich-norm operands of a gemv TAIL=1 binding (none
    /// for every other binding).
    #[allow(clippy::too_many_arguments)]
    pub fn kargs_with(
        &self,
        w: &[Weights],
        x: &Act,
        y: DevPtr,
        m: usize,
        n: usize,
        k: usize,
        extra: Extra,
    ) -> Result<Vec<KArg>, String> {
        let Extra { side, tail } = extra;
        if self.side != side.is_some() {
            return Err(format!(
                "{} {} a side operand",
                self.family.name(),
                if self.side { "needs" } else { "takes no" }
            ));
        }
        match (self.tail, &tail) {
            (TailMode::None, None) | (TailMode::Residual, Some(_)) => {}
            (TailMode::Norm(f), Some(t)) if t.out.format == f => {}
            (TailMode::Norm(f), Some(t)) => {
                return Err(format!(
                    "{} writes its tail's output in {f:?}, got {:?}",
                    self.family.name(),
                    t.out.format
                ))
            }
            (TailMode::None, Some(_)) => {
                return Err(format!("{} takes no tail operands", self.family.name()))
            }
            (_, None) => {
                return Err(format!(
                    "{} needs its tail's operands (TAIL=1)",
                    self.family.name()
                ))
            }
        }
        if w.len() != self.matrices {
            return Err(format!(
                "{} takes {} weight matrices, got {}",
                self.family.name(),
                self.matrices,
                w.len()
            ));
        }
        if x.format != self.act {
            return Err(format!(
                "{} reads {:?} activations, got {:?}",
                self.family.name(),
                self.act,
                x.format
            ));
        }
        let (mi, ni, ki) = (i32_arg(m), i32_arg(n), i32_arg(k));
        Ok(match self.family {
            // gemv_nM(wq, wd, wq2, wd2, x, xq, xds, y, n, k, side, side_stride,
            //         h_in, h_out, w_add, scale, w_out, tout, tout_ds, scratch, eps)
            MatmulFamily::Gemv => {
                let w2 = w.get(1).copied().unwrap_or(Weights { q: NULL, d: NULL });
                let (xf, xq, xds) = match self.act {
                    ActFormat::F32 => (x.data, NULL, NULL),
                    _ => (NULL, x.data, x.scales),
                };
                let s = side.unwrap_or(Side {
                    ptr: NULL,
                    stride: 0,
                });
                vec![
                    ptr(w[0].q),
                    ptr(w[0].d),
                    ptr(w2.q),
                    ptr(w2.d),
                    ptr(xf),
                    ptr(xq),
                    ptr(xds),
                    ptr(y),
                    ni,
                    ki,
                    ptr(s.ptr),
                    i32_arg(s.stride),
                    ptr(tail.map_or(NULL, |t| t.h_in)),
                    ptr(tail.map_or(NULL, |t| t.h_out)),
                    ptr(tail.map_or(NULL, |t| t.w_add)),
                    ptr(tail.map_or(NULL, |t| t.scale)),
                    ptr(tail.map_or(NULL, |t| t.w_out)),
                    ptr(tail.map_or(NULL, |t| t.out.data)),
                    ptr(tail.map_or(NULL, |t| t.out.scales)),
                    ptr(tail.map_or(NULL, |t| t.scratch)),
                    KArg::F32(tail.map_or(0.0, |t| t.eps)),
                ]
            }
            // mmq_gemm(wq, wd, xq, xds, y, M, N, K)
            MatmulFamily::Mmq => vec![
                ptr(w[0].q),
                ptr(w[0].d),
                ptr(x.data),
                ptr(x.scales),
                ptr(y),
                mi,
                ni,
                ki,
            ],
            // gemm_dq / gemm_wgmma(wq, wd, xh, y, M, N, K)
            MatmulFamily::GemmDq | MatmulFamily::GemmWgmma => {
                vec![ptr(w[0].q), ptr(w[0].d), ptr(x.data), ptr(y), mi, ni, ki]
            }
        })
    }

    /// The pre-pass parameters turning f32 `x` (`[m][k]`, contiguous) into
    /// `out` (this binding's format); `None` when there is no pre-pass.
    pub fn prepass_kargs(&self, x: DevPtr, out: &Act, m: usize, k: usize) -> Option<Vec<KArg>> {
        self.prepass.kargs(x, out, m, k)
    }

    /// Geometry of the `gemm_dq_convert` pre-pass for `m*k` values.
    pub fn dq_convert_geometry(m: usize, k: usize) -> crate::device::LaunchGeometry {
        let pairs = (m * k / 2) as u64;
        crate::device::LaunchGeometry {
            kernel: "gemm_dq_convert".into(),
            grid: (pairs.div_ceil(256) as u32, 1, 1),
            block: (256, 1, 1),
            dyn_smem: 0,
        }
    }

    /// Bytes of the device copy of an `[n][k]` weight in this layout
    /// (quant plane or blocks, then scales).
    pub fn weight_bytes(&self, wt: WType, n: usize, k: usize) -> (usize, usize) {
        let (q, d) = self.row_strides(wt, k);
        (n * q, n * d)
    }

    /// Bytes per matrix row of the two device buffers of a weight in this
    /// layout (`Weights::q`, `Weights::d`): rows `r0..` of a matrix start
    /// `r0` strides in, which is how the engine addresses the parts of a
    /// fused matrix. `k` must be whole blocks of `wt`.
    /// - GGUF blocks, and F16/BF16 in any layout: the file's rows, no `d`.
    /// - Planes of Q8_0 / Q4_0: `k/32` quant groups of 32 / 16 bytes, and
    ///   `k/32` f16 (`ScaleType::F16`, the GEMV) or f32 (`F32`, the GEMMs)
    ///   scales.
    /// - Planes of Q4_K / Q5_K / Q6_K (`quant::repack`): the nibble plane
    ///   (`k/2` bytes), and the GEMV side records (`ScaleType::F16`: 16 /
    ///   48 / 88 bytes per 256) or the GEMM side words (`F32`: 2 / 4 / 4
    ///   words per 32).
    pub fn row_strides(&self, wt: WType, k: usize) -> (usize, usize) {
        let nb = k / 32;
        match self.layout {
            WeightLayout::GgufBlocks => (wt.row_bytes(k), 0),
            WeightLayout::Planes { .. } if wt.is_16bit() => (wt.row_bytes(k), 0),
            WeightLayout::Planes { scales } if wt.is_kquant() => (
                nb * wt.quant_bytes_per_block(),
                match scales {
                    ScaleType::F16 => k / 256 * repack::gemv_side_bytes(wt.ggml()),
                    ScaleType::F32 => nb * repack::gemm_side_words(wt.ggml()) * 4,
                },
            ),
            WeightLayout::Planes { scales } => (
                nb * wt.quant_bytes_per_block(),
                nb * match scales {
                    ScaleType::F16 => 2,
                    ScaleType::F32 => 4,
                },
            ),
        }
    }

    /// The device bytes of an `[n][k]` weight matrix of type `wt` in this
    /// layout, built from its GGUF bytes (`n` rows of `wt.row_bytes(k)`):
    /// what the engine uploads for a variant with this binding. Every
    /// repack is lossless (the values the kernels dequantize are ggml's,
    /// bit for bit); `row_strides` gives the row pitch of each buffer.
    pub fn device_weights(
        &self,
        wt: WType,
        gguf: &[u8],
        n: usize,
        k: usize,
    ) -> Result<DeviceWeights, QuantError> {
        let ty = wt.ggml();
        crate::quant::check_row_bytes(ty, gguf.len(), n, k)?;
        Ok(match self.layout {
            WeightLayout::GgufBlocks => DeviceWeights {
                q: gguf.to_vec(),
                d: Vec::new(),
            },
            WeightLayout::Planes { .. } if wt.is_16bit() => DeviceWeights {
                q: gguf.to_vec(),
                d: Vec::new(),
            },
            WeightLayout::Planes { scales } if wt.is_kquant() => {
                let side = match scales {
                    ScaleType::F16 => KSide::Gemv,
                    ScaleType::F32 => KSide::Gemm,
                };
                let p = repack::repack_kquant(ty, gguf, n * k, side)?;
                DeviceWeights {
                    q: p.nibbles,
                    d: p.side,
                }
            }
            WeightLayout::Planes { scales } => {
                let (q, d16) = repack::block32_planes(ty, gguf, n, k);
                let d = match scales {
                    ScaleType::F16 => d16.iter().flat_map(|h| h.to_le_bytes()).collect(),
                    ScaleType::F32 => d16
                        .iter()
                        .flat_map(|&h| crate::quant::blocks::f16_to_f32(h).to_le_bytes())
                        .collect(),
                };
                DeviceWeights { q, d }
            }
        })
    }
}

/// The two device buffers of one weight matrix (`MatmulBinding::device_weights`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceWeights {
    /// GGUF blocks, or the quant plane (`Weights::q`).
    pub q: Vec<u8>,
    /// The scale or side plane (`Weights::d`); empty where the layout has
    /// none, and the kernel takes NULL.
    pub d: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defines::{defines, DefineValue};
    use crate::family::family;
    use crate::quant::GgmlType;

    #[test]
    fn every_matmul_default_binds() {
        for name in ["gemv", "mmq", "gemm_dq", "gemm_wgmma"] {
            let f = family(name).expect("registered");
            let d = f.default_defines(GgmlType::Q8_0);
            let b = MatmulBinding::of(name, &d).expect(name);
            assert_eq!(b.family.name(), name);
            let w = vec![Weights { q: 16, d: 32 }; b.matrices];
            let x = Act {
                format: b.act,
                data: 64,
                scales: 128,
            };
            let args = b.kargs(&w, &x, 256, 4, 8, 64).expect("kargs");
            assert!(args.len() >= 7, "{name}: {} args", args.len());
        }
    }

    /// gemv's Q8_0 defaults (dp4a on Q8_1) and placeholder operands.
    fn gemv_q8_operands() -> (Defines, Act, [Weights; 1]) {
        let d = family("gemv")
            .expect("gemv")
            .default_defines(GgmlType::Q8_0);
        let x = Act {
            format: ActFormat::Q8_1,
            data: 1,
            scales: 2,
        };
        (d, x, [Weights { q: 3, d: 4 }])
    }

    /// gemv FUSE=2 takes one matrix and a side operand (its pointer and
    /// row stride after `k`); every other binding refuses one.
    #[test]
    fn gemv_side_operand_is_passed_only_where_bound() {
        let (mut d, x, w) = gemv_q8_operands();
        let side = Extra {
            side: Some(Side {
                ptr: 0x500,
                stride: 96,
            }),
            tail: None,
        };
        let plain = MatmulBinding::of("gemv", &d).expect("bind");
        assert!(!plain.side);
        assert!(plain.kargs_with(&w, &x, 5, 1, 32, 64, side).is_err());
        d.insert("FUSE".into(), 2i64.into());
        let b = MatmulBinding::of("gemv", &d).expect("bind");
        assert!(b.side);
        assert_eq!(b.matrices, 1);
        let e = b.kargs(&w, &x, 5, 1, 32, 64).expect_err("no side");
        assert!(e.contains("needs a side operand"), "{e}");
        let args = b.kargs_with(&w, &x, 5, 1, 32, 64, side).expect("kargs");
        assert_eq!(args.len(), 21);
        assert_eq!(format!("{:?}", args[10]), format!("{:?}", ptr(0x500)));
        assert_eq!(format!("{:?}", args[11]), format!("{:?}", i32_arg(96)));
    }

    /// gemv TAIL=1 takes the sandwich-norm operands after the side
    /// operand, in the format its TAIL_OUT names; a binding without a
    /// tail refuses them, and one with a tail needs them.
    #[test]
    fn gemv_tail_operands_are_passed_only_where_bound() {
        let (mut d, x, w) = gemv_q8_operands();
        let tail = Tail {
            h_in: 0x10,
            h_out: 0x10,
            w_add: 0x20,
            scale: 0x30,
            w_out: 0x40,
            out: Act {
                format: ActFormat::Q8Split,
                data: 0x50,
                scales: NULL,
            },
            scratch: 0x60,
            eps: 1e-6,
        };
        let with = Extra {
            side: None,
            tail: Some(tail),
        };
        let plain = MatmulBinding::of("gemv", &d).expect("bind");
        assert_eq!(plain.tail, TailMode::None);
        let e = plain
            .kargs_with(&w, &x, 5, 1, 32, 64, with)
            .expect_err("no tail");
        assert!(e.contains("takes no tail"), "{e}");
        d.insert("TAIL".into(), 1i64.into());
        assert_eq!(
            MatmulBinding::of("gemv", &d).expect("bind").tail,
            TailMode::Residual
        );
        d.insert("TAIL_OUT".into(), DefineValue::Str("Q8_SPLIT".into()));
        let b = MatmulBinding::of("gemv", &d).expect("bind");
        assert_eq!(b.tail, TailMode::Norm(ActFormat::Q8Split));
        let e = b.kargs(&w, &x, 5, 1, 32, 64).expect_err("no tail");
        assert!(e.contains("needs its tail"), "{e}");
        let mut f32_out = tail;
        f32_out.out.format = ActFormat::F32;
        let wrong = Extra {
            side: None,
            tail: Some(f32_out),
        };
        assert!(b.kargs_with(&w, &x, 5, 1, 32, 64, wrong).is_err());
        let args = b.kargs_with(&w, &x, 5, 1, 32, 64, with).expect("kargs");
        assert_eq!(args.len(), 21);
        let expect = [0x10, 0x10, 0x20, 0x30, 0x40, 0x50, NULL, 0x60];
        for (i, p) in expect.into_iter().enumerate() {
            assert_eq!(
                format!("{:?}", args[12 + i]),
                format!("{:?}", ptr(p)),
                "arg {}",
                12 + i
            );
        }
        assert_eq!(format!("{:?}", args[20]), format!("{:?}", KArg::F32(1e-6)));
        // TAIL_OUT without TAIL names nothing.
        d.insert("TAIL".into(), 0i64.into());
        assert!(gemv_tail(&d).is_err());
    }

    #[test]
    fn gemv_fuse_takes_two_matrices_and_split_k_zeroes() {
        let mut d = family("gemv")
            .expect("gemv")
            .default_defines(GgmlType::Q4_0);
        d.insert("FUSE".into(), 1i64.into());
        let b = MatmulBinding::of("gemv", &d).expect("bind");
        assert_eq!(b.matrices, 2);
        let x = Act {
            format: b.act,
            data: 1,
            scales: 2,
        };
        assert!(b.kargs(&[Weights { q: 1, d: 2 }], &x, 3, 1, 8, 32).is_err());
        let mut w = family("gemm_wgmma")
            .expect("wgmma")
            .default_defines(GgmlType::Q8_0);
        w.insert("KSPLIT".into(), 2i64.into());
        assert!(
            MatmulBinding::of("gemm_wgmma", &w)
                .expect("bind")
                .zero_output
        );
        let b = MatmulBinding::of("mmq", &defines([("EPI", 0i64)])).expect("mmq");
        assert_eq!(b.weight_bytes(WType::Q8_0, 4, 64), (256, 32));
        assert!(MatmulBinding::of("rmsnorm", &Defines::new()).is_err());
    }

    /// `device_weights` for every weight type and layout: the buffers have
    /// `row_strides` pitches, and decoding them as the kernels do gives
    /// ggml's values bit for bit (the k-quants through the repack decoders,
    /// Q8_0/Q4_0 planes through their scales, F16/BF16 as stored).
    #[test]
    fn device_weights_hold_every_type_losslessly() {
        use crate::quant::repack::{dequant_gemm_planes, dequant_gemv_planes};
        use crate::quant::{dequantize_row, quantize_row};
        let (n, k) = (3usize, 512usize);
        let layouts = [
            WeightLayout::GgufBlocks,
            WeightLayout::Planes {
                scales: ScaleType::F16,
            },
            WeightLayout::Planes {
                scales: ScaleType::F32,
            },
        ];
        for wt in WType::ALL {
            let ty = wt.ggml();
            let mut rng = crate::families::rng_for("device-weights", &[wt as usize], 3);
            let gguf = if ty.can_quantize() {
                let f = crate::families::random_matrix(&mut rng, n, k);
                let mut b = vec![0u8; n * wt.row_bytes(k)];
                quantize_row(ty, &f, &mut b).expect("quantize");
                b
            } else {
                crate::families::random_kquant_blocks(&mut rng, ty, n, k)
            };
            let mut want = vec![0f32; n * k];
            dequantize_row(ty, &gguf, &mut want).expect("dequantize");
            for layout in layouts {
                let b = MatmulBinding {
                    family: MatmulFamily::Gemv,
                    layout,
                    act: ActFormat::F32,
                    prepass: Prepass::None,
                    zero_output: false,
                    matrices: 1,
                    side: false,
                    out: ActFormat::F32,
                    tail: TailMode::None,
                };
                let dw = b.device_weights(wt, &gguf, n, k).expect("device weights");
                let (qs, ds) = b.row_strides(wt, k);
                assert_eq!(
                    (dw.q.len(), dw.d.len()),
                    (n * qs, n * ds),
                    "{wt:?} {layout:?}"
                );
                let mut got = vec![f32::NAN; n * k];
                match (layout, wt) {
                    (WeightLayout::GgufBlocks, _) | (_, WType::F16 | WType::Bf16) => {
                        assert_eq!(dw.q, gguf);
                        continue;
                    }
                    (WeightLayout::Planes { scales }, wt) if wt.is_kquant() => match scales {
                        ScaleType::F16 => dequant_gemv_planes(ty, &dw.q, &dw.d, &mut got),
                        ScaleType::F32 => dequant_gemm_planes(ty, &dw.q, &dw.d, &mut got),
                    }
                    .expect("decode"),
                    (WeightLayout::Planes { scales }, _) => {
                        let qb = wt.quant_bytes_per_block();
                        for (g, y) in got.chunks_exact_mut(32).enumerate() {
                            let d = match scales {
                                ScaleType::F16 => {
                                    crate::quant::blocks::f16_to_f32(u16::from_le_bytes([
                                        dw.d[2 * g],
                                        dw.d[2 * g + 1],
                                    ]))
                                }
                                ScaleType::F32 => f32::from_le_bytes(
                                    dw.d[4 * g..4 * g + 4].try_into().expect("4 bytes"),
                                ),
                            };
                            let q = &dw.q[g * qb..(g + 1) * qb];
                            for (i, v) in y.iter_mut().enumerate() {
                                let qi = if wt == WType::Q8_0 {
                                    q[i] as i8 as i32
                                } else {
                                    ((q[i % 16] >> (4 * (i / 16))) & 15) as i32 - 8
                                };
                                *v = qi as f32 * d;
                            }
                        }
                    }
                }
                for (e, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{wt:?} {layout:?} element {e}");
                }
            }
            assert!(b_rejects_wrong_sizes(wt, &gguf, n, k));
        }
    }

    fn b_rejects_wrong_sizes(wt: WType, gguf: &[u8], n: usize, k: usize) -> bool {
        let b = MatmulBinding::of("mmq", &crate::defines::defines([("EPI", 0i64)])).expect("mmq");
        b.device_weights(wt, &gguf[1..], n, k).is_err()
            && b.device_weights(wt, gguf, n + 1, k).is_err()
    }
}
