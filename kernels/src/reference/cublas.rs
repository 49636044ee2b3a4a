//! A minimal cuBLAS handle: loaded at run time (libcublas.so.13 and the
//! libcublasLt.so.13 it needs), bound to the `Gpu`'s stream with a private
//! workspace, and one call shape: `cublasGemmEx` in the "TN" layout that
//! matches `MatmulProblem` with row-major operands.

use crate::gpu::{DeviceBuffer, Gpu, GpuError};
use cudarc::cublas::sys;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::sync::Arc;

/// Workspace handed to cuBLAS (32 MiB: NVIDIA's recommendation for Hopper;
/// enough for every architecture before it).
const WORKSPACE_BYTES: usize = 32 << 20;

/// What to do when libcublas is missing, for the rows' reason column.
pub const HOW_TO_LOAD: &str = "libcublas.so.13 (with libcublasLt.so.13) could not be loaded: \
    install the pip package nvidia-cublas and put every nvidia/cu13/lib directory of the \
    Python installation on LD_LIBRARY_PATH (the `nvidia` namespace package may span several \
    site-packages directories), as scripts/gpu-tune.sh does";

/// Why a cuBLAS handle could not be made.
#[derive(Debug, thiserror::Error)]
pub enum CublasError {
    /// The library cannot be loaded (the message says how to fix it).
    #[error("{0}")]
    Unavailable(&'static str),
    /// A set-up call failed.
    #[error("{0}")]
    Call(CallError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
}

/// Whether cuBLAS can be loaded; the reason when it cannot.
pub fn available() -> Result<(), CublasError> {
    // SAFETY: only tries to dlopen the library names; calls no symbol.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CublasError::Unavailable(HOW_TO_LOAD))
    }
}

/// The operand type of a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmType {
    /// bf16 x bf16, f32 accumulation, f32 output.
    Bf16,
    /// int8 x int8, int32 accumulation, int32 output.
    Int8,
}

/// A failed cuBLAS call: the status and whether it means "this shape or
/// type is not supported" rather than a broken call.
#[derive(Clone, Debug)]
pub struct CallError {
    pub status: sys::cublasStatus_t,
    pub what: String,
}

impl CallError {
    pub fn unsupported(&self) -> bool {
        matches!(
            self.status,
            sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED
                | sys::cublasStatus_t::CUBLAS_STATUS_ARCH_MISMATCH
        )
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} returned {:?}", self.what, self.status)
    }
}

fn check(what: &str, st: sys::cublasStatus_t) -> Result<(), CallError> {
    if st == sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(CallError {
            status: st,
            what: what.to_string(),
        })
    }
}

pub struct Cublas {
    ctx: Arc<CudaContext>,
    handle: sys::cublasHandle_t,
    /// Kept alive for as long as the handle uses it.
    _workspace: DeviceBuffer,
    version: i32,
}

impl Cublas {
    /// Loads cuBLAS, creates a handle on `gpu`'s context, and binds it to
    /// `gpu`'s stream (so CUDA events on that stream bracket its calls) with
    /// a workspace of its own.
    pub fn new(gpu: &Gpu) -> Result<Cublas, CublasError> {
        available()?;
        gpu.bind()?;
        let mut handle: sys::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: the library is loaded (checked above); `handle` is a valid
        // out-pointer and the context is current on this thread.
        check("cublasCreate", unsafe { sys::cublasCreate_v2(&mut handle) })
            .map_err(CublasError::Call)?;
        let workspace = match gpu.alloc(WORKSPACE_BYTES) {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created above, destroyed once.
                unsafe { sys::cublasDestroy_v2(handle) };
                return Err(e.into());
            }
        };
        let mut c = Cublas {
            ctx: gpu.context(),
            handle,
            _workspace: workspace,
            version: 0,
        };
        // The stream first: cublasSetStream resets the workspace to cuBLAS's
        // default pool.
        // SAFETY: valid handle; the stream belongs to the same context and
        // outlives `c` (both are owned by the caller's `Gpu`).
        check("cublasSetStream", unsafe {
            sys::cublasSetStream_v2(c.handle, gpu.stream() as sys::cudaStream_t)
        })
        .map_err(CublasError::Call)?;
        // SAFETY: the workspace is a live device allocation of
        // WORKSPACE_BYTES (256-byte aligned by cuMemAlloc) owned by `c`.
        check("cublasSetWorkspace", unsafe {
            sys::cublasSetWorkspace_v2(c.handle, c._workspace.ptr() as *mut c_void, WORKSPACE_BYTES)
        })
        .map_err(CublasError::Call)?;
        // SAFETY: valid handle and out-pointer.
        check("cublasGetVersion", unsafe {
            sys::cublasGetVersion_v2(c.handle, &mut c.version)
        })
        .map_err(CublasError::Call)?;
        Ok(c)
    }

    /// "13.1.0" from cublasGetVersion's 130100.
    pub fn version(&self) -> String {
        let v = self.version;
        format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100)
    }

    /// Enqueues y[m][n] = sum_k x[m][k] * w[n][k] on the handle's stream,
    /// every matrix row-major and dense (row strides k, k and n).
    ///
    /// cuBLAS is column-major: row-major w (n x k) is the column-major k x n
    /// matrix A (lda = k), row-major x (m x k) is the column-major k x m
    /// matrix B (ldb = k), and row-major y (m x n) is the column-major n x m
    /// matrix C (ldc = n). So C = A^T B: transa = T, transb = N, cuBLAS's
    /// (m, n, k) = (n, m, k). This "TN" form is also the one int8 GEMM
    /// requires (both operands k-contiguous).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_tn(
        &self,
        gpu: &Gpu,
        ty: GemmType,
        m: usize,
        n: usize,
        k: usize,
        w: &DeviceBuffer,
        x: &DeviceBuffer,
        y: &DeviceBuffer,
    ) -> Result<(), CallError> {
        let dim = |v: usize, what: &str| {
            i32::try_from(v).map_err(|_| CallError {
                status: sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
                what: format!("{what}={v} exceeds cuBLAS's 32-bit dimensions"),
            })
        };
        let (mi, ni, ki) = (dim(m, "m")?, dim(n, "n")?, dim(k, "k")?);
        let esz = match ty {
            GemmType::Bf16 => 2,
            GemmType::Int8 => 1,
        };
        if w.bytes() < n * k * esz || x.bytes() < m * k * esz || y.bytes() < m * n * 4 {
            return Err(CallError {
                status: sys::cublasStatus_t::CUBLAS_STATUS_INVALID_VALUE,
                what: format!("operand buffers too small for m={m} n={n} k={k}"),
            });
        }
        gpu.bind().map_err(|e| CallError {
            status: sys::cublasStatus_t::CUBLAS_STATUS_NOT_INITIALIZED,
            what: e.to_string(),
        })?;
        let (one_f, zero_f) = (1.0f32, 0.0f32);
        let (one_i, zero_i) = (1i32, 0i32);
        let (ab, c_ty, compute, alpha, beta): (_, _, _, *const c_void, *const c_void) = match ty {
            GemmType::Bf16 => (
                sys::cudaDataType::CUDA_R_16BF,
                sys::cudaDataType::CUDA_R_32F,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                &one_f as *const f32 as *const c_void,
                &zero_f as *const f32 as *const c_void,
            ),
            // CUBLAS_COMPUTE_32I scales with int32 alpha and beta.
            GemmType::Int8 => (
                sys::cudaDataType::CUDA_R_8I,
                sys::cudaDataType::CUDA_R_32I,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32I,
                &one_i as *const i32 as *const c_void,
                &zero_i as *const i32 as *const c_void,
            ),
        };
        // SAFETY: the handle is live and bound to the GPU's stream; w, x and
        // y are live device allocations at least as large as the matrices
        // described (checked above); alpha and beta point at host scalars of
        // the compute type's scale type that outlive the call (the default
        // host pointer mode reads them before returning).
        check("cublasGemmEx", unsafe {
            sys::cublasGemmEx(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_T,
                sys::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                alpha,
                w.ptr() as *const c_void,
                ab,
                ki,
                x.ptr() as *const c_void,
                ab,
                ki,
                beta,
                y.ptr() as *mut c_void,
                c_ty,
                ni,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}

impl Drop for Cublas {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in `new`, destroyed exactly once here, with its
        // context current; pending work on the stream is waited for first.
        let _ = self.ctx.synchronize();
        let _ = unsafe { sys::cublasDestroy_v2(self.handle) };
    }
}

/// Maps a failed call into the timing loop's error: unsupported shapes are
/// "rejected" (not a broken run), anything else is an error.
pub(crate) fn to_gpu_error(name: &str, e: CallError) -> GpuError {
    if e.unsupported() {
        GpuError::Rejected(format!("{name}: {e}"))
    } else {
        GpuError::Other(format!("{name}: {e}"))
    }
}
