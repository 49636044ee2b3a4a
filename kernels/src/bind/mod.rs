//! The calling convention of every kernel family, in one public, typed layer.
//!
//! A family's kernels are launched the same way by `check` and `tune` (whose
//! workloads are built on these types) and by the CUDA engine: the argument
//! order, the layout of every buffer, the activation format a kernel reads
//! or writes, the pre-passes it needs and whether its output must be zeroed
//! first are written here once. `docs/calling-convention.md` is the prose
//! form of the same contract.
//!
//! Each family has a module with an `Args` struct naming its buffers (device
//! addresses) and scalars; `Args::kargs` turns it into the kernel's parameter
//! list in the order of the `extern "C"` signature in `kernels/cuda/`.

pub mod attention;
pub mod matmul;
pub mod moe;
pub mod rows;

use crate::gpu::KArg;

/// A device address: a buffer the engine or a check workload owns.
pub type DevPtr = u64;

/// The null pointer, for optional buffers a kernel checks at run time.
pub const NULL: DevPtr = 0;

/// Bytes of one split Q8 record (`q8_split.cuh`'s `XSplit`): q1[32] and
/// q2[32] as int8, then d1, d2 (f32) and s1, s2 (i32), little-endian.
pub const Q8_SPLIT_RECORD: usize = 80;

/// The format of an activation tensor `[rows][width]` that one kernel
/// writes and the next reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActFormat {
    /// f32, row-major.
    F32,
    /// Q8_1 planes: int8 quants `[rows][width]` and per-32 `(d, sum)` f32
    /// pairs `[rows][width/32]` (`families::q8_1_replay` is the rule); read
    /// by the dp4a GEMV and by mmq.
    Q8_1,
    /// f16 `[rows][width]` with the k order permuted inside every group of
    /// 16 (`dq_convert.cuh`); read by gemm_dq and gemm_wgmma with DQ_TYPE=F16.
    DqF16,
    /// The same with bf16 values (DQ_TYPE=BF16).
    DqBf16,
    /// Split Q8 records: per 32 values one 80-byte record (`q8_split.cuh`:
    /// two int8 planes, `x ~ d1 q1 + d2 q2`, then d1, d2 and the two
    /// integer sums), `[rows][width/32]`; `families::q8_split_records` is
    /// the rule. Read by the GEMV's ALGO 3.
    Q8Split,
}

impl ActFormat {
    /// The `OUT` define value of the kernels that can write this format.
    pub fn define(self) -> &'static str {
        match self {
            ActFormat::F32 => "F32",
            ActFormat::Q8_1 => "Q8_1",
            ActFormat::DqF16 => "DQ_F16",
            ActFormat::DqBf16 => "DQ_BF16",
            ActFormat::Q8Split => "Q8_SPLIT",
        }
    }
    /// The format an `OUT` define value names (`define`'s inverse).
    pub fn from_define(v: &str) -> Option<ActFormat> {
        [
            ActFormat::F32,
            ActFormat::Q8_1,
            ActFormat::DqF16,
            ActFormat::DqBf16,
            ActFormat::Q8Split,
        ]
        .into_iter()
        .find(|f| f.define() == v)
    }
    /// Bytes of the main plane of `rows x width` values.
    pub fn bytes(self, rows: usize, width: usize) -> usize {
        match self {
            ActFormat::F32 => rows * width * 4,
            ActFormat::Q8_1 => rows * width,
            ActFormat::DqF16 | ActFormat::DqBf16 => rows * width * 2,
            ActFormat::Q8Split => rows * (width / 32) * Q8_SPLIT_RECORD,
        }
    }
    /// Bytes of the scale plane (Q8_1 only).
    pub fn scale_bytes(self, rows: usize, width: usize) -> usize {
        match self {
            ActFormat::Q8_1 => rows * (width / 32) * 8,
            _ => 0,
        }
    }
}

/// An activation buffer in some format: the main plane and, for Q8_1, the
/// scale plane (`NULL` otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Act {
    pub format: ActFormat,
    pub data: DevPtr,
    pub scales: DevPtr,
}

impl Act {
    pub fn f32(data: DevPtr) -> Act {
        Act {
            format: ActFormat::F32,
            data,
            scales: NULL,
        }
    }
}

pub(crate) fn ptr(p: DevPtr) -> KArg {
    KArg::Ptr(p)
}

pub(crate) fn i32_arg(v: usize) -> KArg {
    KArg::I32(v as i32)
}
