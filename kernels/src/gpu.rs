//! A thin wrapper over cudarc's driver API: one context and one stream per
//! `Gpu`, device attributes, cubin module loading, raw device buffers and
//! kernel launches.
//!
//! A missing driver or GPU is the typed error `GpuError::NoGpu`
//! ("no CUDA GPU: ..."), never a panic.

use crate::compile::CompiledVariant;
use crate::cubin::{Cubin, ParamLayout};
use crate::device::{Arch, DeviceLimits, LaunchGeometry};
use cudarc::driver::{result, sys, CudaContext, CudaStream, DriverError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum GpuError {
    #[error("no CUDA GPU: {0}")]
    NoGpu(String),
    #[error("CUDA driver error in {what}: {err}")]
    Driver { what: String, err: DriverError },
    #[error(transparent)]
    Compile(#[from] crate::compile::CompileError),
    /// The variant was rejected by `validate` for this problem.
    #[error("{0}")]
    Rejected(String),
    /// A launch's arguments do not pack to the kernel's parameter buffer
    /// (`check_args`; checked in debug builds).
    #[error("kernel {kernel}: the launch arguments do not match its parameters: {reason}")]
    Args { kernel: String, reason: String },
    #[error("{0}")]
    Other(String),
}

pub(crate) fn drv<T>(what: &str, r: Result<T, DriverError>) -> Result<T, GpuError> {
    r.map_err(|err| GpuError::Driver {
        what: what.to_string(),
        err,
    })
}

/// What the device says about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub sm_count: u32,
    pub l2_bytes: u64,
    pub cc: (u32, u32),
    /// cuDriverGetVersion, e.g. 13000 for CUDA 13.0.
    pub driver_version: i32,
    pub smem_optin_per_block: u32,
    pub smem_per_sm: u32,
    pub max_threads_per_block: u32,
    /// Maximum (boost) SM clock as reported by the driver.
    pub clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub mem_bus_bits: u32,
    pub total_mem_bytes: u64,
    /// "dddd:bb:dd.0" (hex), the key NVML finds this device by (CUDA and
    /// NVML may number devices differently).
    #[serde(default)]
    pub pci_bus_id: String,
}

/// How many CUDA devices the driver reports, without opening a context;
/// `NoGpu` when the driver library cannot be loaded or initialised.
pub fn device_count() -> Result<usize, GpuError> {
    // SAFETY: only attempts to dlopen libcuda; no symbol is called.
    if !unsafe { sys::is_culib_present() } {
        return Err(GpuError::NoGpu(
            "the CUDA driver library (libcuda.so) could not be loaded".into(),
        ));
    }
    result::init().map_err(|e| GpuError::NoGpu(format!("cuInit failed: {e}")))?;
    let count = CudaContext::device_count()
        .map_err(|e| GpuError::NoGpu(format!("cuDeviceGetCount failed: {e}")))?;
    Ok(count.max(0) as usize)
}

pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    info: DeviceInfo,
    /// Whether plain launches are enqueued as programmatic dependents of a
    /// kernel launch just before them (`set_chained_launches`).
    chain_on: AtomicBool,
    /// Whether the last operation enqueued on the stream was a kernel launch.
    after_kernel: AtomicBool,
}

impl Gpu {
    /// Opens device `ordinal`: context, a private stream, attributes.
    pub fn new(ordinal: usize) -> Result<Gpu, GpuError> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(GpuError::NoGpu(format!(
                "device {ordinal} requested but the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|e| GpuError::NoGpu(format!("creating a context on device {ordinal}: {e}")))?;
        // Launches here pass raw pointers; cudarc's per-argument event
        // tracking would only add work to the timed region.
        // SAFETY: no cudarc-tracked allocation is shared across streams here.
        unsafe { ctx.disable_event_tracking() };
        let stream = drv("cuStreamCreate", ctx.new_stream())?;
        let attr = |a: sys::CUdevice_attribute| -> Result<i32, GpuError> {
            drv("cuDeviceGetAttribute", ctx.attribute(a))
        };
        use sys::CUdevice_attribute as A;
        let mut driver_version = 0i32;
        // SAFETY: the driver library is loaded (checked above); valid out-pointer.
        unsafe { sys::cuDriverGetVersion(&mut driver_version) }
            .result()
            .map_err(|err| GpuError::Driver {
                what: "cuDriverGetVersion".into(),
                err,
            })?;
        let info = DeviceInfo {
            ordinal,
            name: drv("cuDeviceGetName", ctx.name())?,
            sm_count: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32,
            l2_bytes: attr(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64,
            cc: (
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            driver_version,
            smem_optin_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?
                as u32,
            smem_per_sm: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)? as u32,
            max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)? as u32,
            clock_mhz: (attr(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE)? / 1000) as u32,
            mem_clock_mhz: (attr(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE)? / 1000) as u32,
            mem_bus_bits: attr(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)? as u32,
            total_mem_bytes: drv("cuDeviceTotalMem", ctx.total_mem())? as u64,
            pci_bus_id: format!(
                "{:04x}:{:02x}:{:02x}.0",
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
                attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?
            ),
        };
        Ok(Gpu {
            ctx,
            stream,
            info,
            chain_on: AtomicBool::new(false),
            after_kernel: AtomicBool::new(false),
        })
    }

    /// Chained launches (timing in the engine's decode mode): while on, every
    /// `launch` that directly follows another kernel launch on the stream is
    /// enqueued as a programmatic dependent of it, as `launch_dependent`
    /// does; a launch after any other stream operation (a fill, a copy, an
    /// event) stays in stream order, since only a kernel's completion can be
    /// awaited by `griddepcontrol.wait`. Every kernel of this repository
    /// waits before it touches memory another grid writes (`pdl_enter`), so
    /// the results are those of stream order. Off by default.
    pub fn set_chained_launches(&self, on: bool) {
        self.chain_on.store(on, Ordering::Relaxed);
        self.after_kernel.store(false, Ordering::Relaxed);
    }

    /// Records that a stream operation other than a kernel launch was
    /// enqueued: the next chained launch waits in stream order.
    fn other_op(&self) {
        self.after_kernel.store(false, Ordering::Relaxed);
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    pub fn arch(&self) -> Arch {
        Arch(self.info.cc.0 * 10 + self.info.cc.1)
    }

    pub fn limits(&self) -> DeviceLimits {
        DeviceLimits {
            arch: self.arch(),
            max_smem_per_block: self.info.smem_optin_per_block,
            max_threads_per_block: self.info.max_threads_per_block,
            sm_count: self.info.sm_count,
            l2_bytes: self.info.l2_bytes,
        }
    }

    pub(crate) fn bind(&self) -> Result<(), GpuError> {
        drv("cuCtxSetCurrent", self.ctx.bind_to_thread())
    }

    /// The context, for wrappers of other CUDA libraries that must make it
    /// current when they release their handles.
    pub(crate) fn context(&self) -> Arc<CudaContext> {
        self.ctx.clone()
    }

    pub(crate) fn stream(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    pub(crate) fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    pub fn synchronize(&self) -> Result<(), GpuError> {
        self.bind()?;
        drv("cuStreamSynchronize", self.stream.synchronize())
    }

    /// Free and total device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize), GpuError> {
        self.bind()?;
        drv("cuMemGetInfo", self.ctx.mem_get_info())
    }

    /// Loads a compiled variant eagerly: the module, every kernel entry the
    /// cubin's symbol table lists (the compile log plays no part), the
    /// dynamic shared-memory opt-in, and a cross-check of the compile-time
    /// register / static smem / stack counts against cuFuncGetAttribute.
    pub fn load(&self, cv: &CompiledVariant) -> Result<Module, GpuError> {
        self.bind()?;
        if cv.arch != self.arch() {
            return Err(GpuError::Other(format!(
                "{}: compiled for {} but the device is {}",
                cv.family,
                cv.arch,
                self.arch()
            )));
        }
        // cuModuleLoadData reads the image in place; give it an 8-aligned copy.
        let mut image: Vec<u64> = vec![0; cv.cubin.len().div_ceil(8) + 1];
        // SAFETY: `image` has at least cv.cubin.len() bytes; u64 -> u8 view is valid.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(image.as_mut_ptr() as *mut u8, image.len() * 8)
        };
        bytes[..cv.cubin.len()].copy_from_slice(&cv.cubin);
        // SAFETY: `image` holds a complete cubin produced by NVRTC and lives
        // until the call returns (the driver copies it).
        let module = drv("cuModuleLoadData", unsafe {
            result::module::load_data(image.as_ptr() as *const c_void)
        })?;
        let mut m = Module {
            ctx: self.ctx.clone(),
            module,
            functions: BTreeMap::new(),
            params: BTreeMap::new(),
            attribute_notes: Vec::new(),
        };
        match Cubin::parse(&cv.cubin) {
            Ok(c) => {
                for k in &c.kernels {
                    m.params.insert(k.name.clone(), k.param_layout());
                }
            }
            Err(e) => m.attribute_notes.push(format!(
                "{}: cubin attributes unreadable ({e}); launch arguments go unchecked",
                cv.family
            )),
        }
        let max_dyn = self.info.smem_optin_per_block as i32;
        let names = match crate::cubin::entry_names(&cv.cubin) {
            Ok(n) => n,
            // Only an unreadable symbol table gets here; the compile-time
            // list is the best remaining guess, and the note says so.
            Err(e) => {
                m.attribute_notes.push(format!(
                    "{}: cubin symbol table unreadable ({e}); loading the compile-time function list",
                    cv.family
                ));
                cv.functions.iter().map(|f| f.name.clone()).collect()
            }
        };
        for name in names {
            let cname = CString::new(name.as_str())
                .map_err(|_| GpuError::Other(format!("bad function name {name}")))?;
            // SAFETY: `module` is loaded and not unloaded until `m` drops.
            let f = drv("cuModuleGetFunction", unsafe {
                result::module::get_function(m.module, cname)
            })?;
            use sys::CUfunction_attribute as FA;
            let get = |a: FA| -> Result<i32, GpuError> {
                // SAFETY: `f` is a valid function of a loaded module.
                drv("cuFuncGetAttribute", unsafe {
                    result::function::get_function_attribute(f, a)
                })
            };
            let regs = get(FA::CU_FUNC_ATTRIBUTE_NUM_REGS)? as u32;
            let smem = get(FA::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)? as u32;
            let local = get(FA::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)? as u32;
            match cv.function(&name) {
                Some(fr)
                    if regs == fr.registers && smem == fr.static_smem && local == fr.stack_bytes => {}
                Some(fr) => m.attribute_notes.push(format!(
                    "{name}: compile time ({}) said regs={} smem={} stack={}, driver says regs={regs} smem={smem} local={local}",
                    cv.resources_source, fr.registers, fr.static_smem, fr.stack_bytes
                )),
                None => m.attribute_notes.push(format!(
                    "{name}: no compile-time resources; driver says regs={regs} smem={smem} local={local}"
                )),
            }
            let dyn_allowed = (max_dyn - smem as i32).max(0);
            // SAFETY: valid function; the value is within the device's opt-in limit.
            drv("cuFuncSetAttribute", unsafe {
                result::function::set_function_attribute(
                    f,
                    FA::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    dyn_allowed,
                )
            })?;
            m.functions.insert(name, f);
        }
        Ok(m)
    }

    /// Allocates `bytes` of device memory (uninitialised), stream-ordered on
    /// this GPU's stream: the memory is ready for every later operation on
    /// the stream, and `DeviceBuffer::drop` frees it the same way, so a
    /// free never synchronizes the context (a decode graph can be captured
    /// while buffers come and go).
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        self.bind()?;
        self.other_op();
        // SAFETY: stream-ordered allocation on this GPU's live stream; freed
        // once, on the same stream, in DeviceBuffer::drop.
        let ptr = drv("cuMemAllocAsync", unsafe {
            result::malloc_async(self.stream(), bytes.max(16))
        })?;
        Ok(DeviceBuffer {
            ctx: self.ctx.clone(),
            stream: self.stream.clone(),
            ptr,
            bytes,
        })
    }

    /// Enqueues a copy of `len` elements of `data`, from element `from`,
    /// into `dst` at byte `offset` on the stream, from page-locked host
    /// memory, so the call returns at once. The caller keeps those elements
    /// unchanged until the stream has passed the copy.
    pub fn write_async_from<T: Copy>(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        data: &PinnedBuf<T>,
        from: usize,
        len: usize,
    ) -> Result<(), GpuError> {
        let n = len * std::mem::size_of::<T>();
        if from + len > data.len() || offset + n > dst.bytes {
            return Err(GpuError::Other(format!(
                "async write of {n} bytes at {offset} past a {}-byte buffer (or elements {from}..{} of {} staged)",
                dst.bytes,
                from + len,
                data.len()
            )));
        }
        self.bind()?;
        self.other_op();
        // SAFETY: bounds checked above; the pinned source lives in `data`,
        // which the caller keeps until the stream passes the copy.
        drv("cuMemcpyHtoDAsync", unsafe {
            result::memcpy_htod_async(
                dst.ptr + offset as u64,
                &data.as_slice()[from..from + len],
                self.stream(),
            )
        })
    }

    /// Enqueues `words` 32-bit stores of `pattern` into `dst` from byte
    /// `offset` on the stream.
    pub fn fill_u32_range(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        words: usize,
        pattern: u32,
    ) -> Result<(), GpuError> {
        if offset % 4 != 0 || offset + 4 * words > dst.bytes {
            return Err(GpuError::Other(format!(
                "fill of {words} words at byte {offset} outside a {}-byte buffer",
                dst.bytes
            )));
        }
        self.bind()?;
        self.other_op();
        // SAFETY: the range was checked against the live buffer above.
        unsafe { sys::cuMemsetD32Async(dst.ptr + offset as u64, pattern, words, self.stream()) }
            .result()
            .map_err(|err| GpuError::Driver {
                what: "cuMemsetD32Async".into(),
                err,
            })
    }

    /// Enqueues a copy of `len` elements of `src` (from byte `offset`) into
    /// page-locked host memory; read `dst` after synchronizing the stream.
    pub fn read_async<T: Copy>(
        &self,
        src: &DeviceBuffer,
        offset: usize,
        dst: &mut PinnedBuf<T>,
        len: usize,
    ) -> Result<(), GpuError> {
        let n = len * std::mem::size_of::<T>();
        if len > dst.len() || offset + n > src.bytes {
            return Err(GpuError::Other(format!(
                "async read of {n} bytes at {offset} past a {}-byte buffer (or {len} > {} staged)",
                src.bytes,
                dst.len()
            )));
        }
        self.bind()?;
        self.other_op();
        // SAFETY: bounds checked above; the pinned destination outlives the
        // copy because the caller synchronizes before reading or dropping it.
        drv("cuMemcpyDtoHAsync", unsafe {
            result::memcpy_dtoh_async(
                &mut dst.as_mut_slice()[..len],
                src.ptr + offset as u64,
                self.stream(),
            )
        })
    }

    /// Enqueues a device-to-device copy of `bytes` bytes between two buffer
    /// ranges on the stream.
    pub fn copy_range(
        &self,
        dst: &DeviceBuffer,
        dst_offset: usize,
        src: &DeviceBuffer,
        src_offset: usize,
        bytes: usize,
    ) -> Result<(), GpuError> {
        if dst_offset + bytes > dst.bytes || src_offset + bytes > src.bytes {
            return Err(GpuError::Other(format!(
                "copy of {bytes} bytes out of range ({}+{bytes} of {}, {}+{bytes} of {})",
                dst_offset, dst.bytes, src_offset, src.bytes
            )));
        }
        self.bind()?;
        self.other_op();
        // SAFETY: both ranges were checked against their buffers.
        drv("cuMemcpyDtoDAsync", unsafe {
            result::memcpy_dtod_async(
                dst.ptr + dst_offset as u64,
                src.ptr + src_offset as u64,
                bytes,
                self.stream(),
            )
        })
    }

    /// Allocates and uploads a host slice.
    pub fn upload<T: Copy>(&self, data: &[T]) -> Result<DeviceBuffer, GpuError> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.write(&b, 0, data)?;
        Ok(b)
    }

    /// Copies `data` into `dst` at byte `offset` (synchronous).
    pub fn write<T: Copy>(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        data: &[T],
    ) -> Result<(), GpuError> {
        let n = std::mem::size_of_val(data);
        if offset + n > dst.bytes {
            return Err(GpuError::Other(format!(
                "write of {n} bytes at {offset} past a {}-byte buffer",
                dst.bytes
            )));
        }
        self.bind()?;
        self.synchronize()?;
        // SAFETY: bounds checked above; `data` is a valid host slice of n bytes.
        drv("cuMemcpyHtoD", unsafe {
            result::memcpy_htod_sync(dst.ptr + offset as u64, data)
        })
    }

    /// Downloads a whole buffer as `T`s (synchronises the stream first).
    pub fn download<T: Copy + Default>(&self, src: &DeviceBuffer) -> Result<Vec<T>, GpuError> {
        let n = src.bytes / std::mem::size_of::<T>();
        let mut v = vec![T::default(); n];
        self.synchronize()?;
        // SAFETY: `v` holds n*size_of::<T>() <= src.bytes bytes.
        drv("cuMemcpyDtoH", unsafe {
            result::memcpy_dtoh_sync(&mut v, src.ptr)
        })?;
        Ok(v)
    }

    /// Fills a buffer with a repeated 32-bit pattern on the stream (used to
    /// poison outputs with NaN before a run).
    pub fn fill_u32(&self, dst: &DeviceBuffer, pattern: u32) -> Result<(), GpuError> {
        self.bind()?;
        self.other_op();
        // SAFETY: the buffer holds at least bytes/4 words.
        unsafe { sys::cuMemsetD32Async(dst.ptr, pattern, dst.bytes / 4, self.stream()) }
            .result()
            .map_err(|err| GpuError::Driver {
                what: "cuMemsetD32Async".into(),
                err,
            })
    }

    /// Device-to-device copy of `src` into `dst` (same length) on the stream.
    pub fn copy(&self, dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<(), GpuError> {
        self.bind()?;
        self.other_op();
        let n = dst.bytes.min(src.bytes);
        // SAFETY: both buffers hold at least n bytes.
        drv("cuMemcpyDtoDAsync", unsafe {
            result::memcpy_dtod_async(dst.ptr, src.ptr, n, self.stream())
        })
    }

    /// Enqueues one launch of `geo.kernel` from `m` with the given arguments.
    /// With `launch_args_checked`, arguments that do not pack to the kernel's
    /// parameter buffer are refused (`GpuError::Args`) before anything is
    /// enqueued.
    pub fn launch(&self, m: &Module, geo: &LaunchGeometry, args: &[KArg]) -> Result<(), GpuError> {
        let f = m.function(&geo.kernel)?;
        if launch_args_checked() {
            m.check_args(&geo.kernel, args)?;
        }
        self.launch_function(f, geo, args)
    }

    /// Enqueues one launch of a resolved function (no name lookup).
    pub(crate) fn launch_function(
        &self,
        f: sys::CUfunction,
        geo: &LaunchGeometry,
        args: &[KArg],
    ) -> Result<(), GpuError> {
        let chained = self.chain_on.load(Ordering::Relaxed)
            && self.after_kernel.load(Ordering::Relaxed)
            && self.arch().0 >= 90;
        self.launch_function_as(f, geo, args, chained)
    }

    /// Enqueues one launch of `geo.kernel` from `m` as a programmatic
    /// dependent of the launch before it on the stream (PDL, sm_90 and
    /// later): it may be scheduled while that grid drains, so the kernel must
    /// wait for it (`griddepcontrol.wait`) before it reads what that grid
    /// wrote. Elsewhere a plain launch (stream order). Arguments are checked
    /// as by `launch`.
    pub fn launch_dependent(
        &self,
        m: &Module,
        geo: &LaunchGeometry,
        args: &[KArg],
    ) -> Result<(), GpuError> {
        let f = m.function(&geo.kernel)?;
        if launch_args_checked() {
            m.check_args(&geo.kernel, args)?;
        }
        self.launch_function_dependent(f, geo, args)
    }

    /// As `launch_dependent`, for a resolved function.
    pub(crate) fn launch_function_dependent(
        &self,
        f: sys::CUfunction,
        geo: &LaunchGeometry,
        args: &[KArg],
    ) -> Result<(), GpuError> {
        self.launch_function_as(f, geo, args, self.arch().0 >= 90)
    }

    fn launch_function_as(
        &self,
        f: sys::CUfunction,
        geo: &LaunchGeometry,
        args: &[KArg],
        programmatic: bool,
    ) -> Result<(), GpuError> {
        self.after_kernel.store(true, Ordering::Relaxed);
        let mut vals: Vec<[u64; 1]> = args
            .iter()
            .map(|a| match *a {
                KArg::Ptr(p) => [p],
                KArg::I32(v) => [v as u32 as u64],
                KArg::F32(v) => [v.to_bits() as u64],
                KArg::U64(v) => [v],
            })
            .collect();
        // Each parameter points at its own 8-byte slot; 4-byte parameters
        // read the low half (little-endian), as the driver copies by size.
        let mut params: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|v| v.as_mut_ptr() as *mut c_void)
            .collect();
        self.bind()?;
        if programmatic {
            let mut value: sys::CUlaunchAttributeValue =
                // SAFETY: a plain C union of integers and structs of integers;
                // all-zero is a valid value of every member.
                unsafe { std::mem::zeroed() };
            value.programmaticStreamSerializationAllowed = 1;
            let mut attr = sys::CUlaunchAttribute {
                id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = sys::CUlaunchConfig {
                gridDimX: geo.grid.0,
                gridDimY: geo.grid.1,
                gridDimZ: geo.grid.2,
                blockDimX: geo.block.0,
                blockDimY: geo.block.1,
                blockDimZ: geo.block.2,
                sharedMemBytes: geo.dyn_smem,
                hStream: self.stream(),
                attrs: &mut attr,
                numAttrs: 1,
            };
            // SAFETY: as for cuLaunchKernel below; `config` and the one
            // attribute it points at live until the call returns.
            return drv(&format!("cuLaunchKernelEx({})", geo.kernel), unsafe {
                sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut())
                    .result()
            });
        }
        // SAFETY: `f` comes from a loaded module; `params` matches the
        // kernel's parameter list (each family builds args for its own
        // entry); every pointer argument is a live device allocation owned by
        // the caller's workload, which outlives the synchronisation that
        // follows any launch.
        drv(&format!("cuLaunchKernel({})", geo.kernel), unsafe {
            result::launch_kernel(
                f,
                geo.grid,
                geo.block,
                geo.dyn_smem,
                self.stream(),
                &mut params,
            )
        })
    }

    /// Resident blocks per SM for `geo` (cuOccupancyMaxActiveBlocksPerMultiprocessor).
    pub fn occupancy(&self, m: &Module, geo: &LaunchGeometry) -> Result<u32, GpuError> {
        let f = m.function(&geo.kernel)?;
        self.bind()?;
        // SAFETY: `f` belongs to a loaded module; plain query.
        let n = drv("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                f,
                geo.threads() as i32,
                geo.dyn_smem as usize,
            )
        })?;
        Ok(n.max(0) as u32)
    }

    /// A fresh event on this GPU's context (timing enabled).
    pub fn event(&self) -> Result<Event, GpuError> {
        self.bind()?;
        let e = drv(
            "cuEventCreate",
            result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )?;
        Ok(Event {
            ctx: self.ctx.clone(),
            ev: e,
        })
    }

    /// Records `e` on this GPU's stream.
    pub fn record(&self, e: &Event) -> Result<(), GpuError> {
        self.other_op();
        // SAFETY: both handles are live.
        drv("cuEventRecord", unsafe {
            result::event::record(e.ev, self.stream())
        })
    }

    /// Records `e` on this GPU's stream with `CU_EVENT_RECORD_EXTERNAL`:
    /// while the stream is being captured this becomes an event-record node
    /// of the graph, so every replay records `e` again at that point (timing
    /// inside a graph); a plain `record` during capture would only be a
    /// dependency between captured streams. Outside capture it records as
    /// `record` does.
    pub fn record_external(&self, e: &Event) -> Result<(), GpuError> {
        self.other_op();
        let flags = sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32;
        // SAFETY: both handles are live; the flag is one the driver defines.
        drv("cuEventRecordWithFlags", unsafe {
            sys::cuEventRecordWithFlags(e.ev, self.stream(), flags).result()
        })
    }

    /// Checks for an asynchronous error from earlier launches.
    pub fn check_async(&self) -> Result<(), GpuError> {
        self.synchronize()
    }
}

/// Page-locked host memory of `len` elements of `T`, the source and
/// destination of asynchronous copies (pageable memory would make the driver
/// stage, and sometimes synchronize, every copy).
pub struct PinnedBuf<T: Copy> {
    ctx: Arc<CudaContext>,
    ptr: *mut T,
    len: usize,
}

// SAFETY: the buffer is plain host memory owned by this handle; it has no
// thread affinity, and the handle gives out references only through &self /
// &mut self.
unsafe impl<T: Copy + Send> Send for PinnedBuf<T> {}

impl<T: Copy + Default> PinnedBuf<T> {
    /// `len` elements, each `T::default()`.
    pub fn new(gpu: &Gpu, len: usize) -> Result<PinnedBuf<T>, GpuError> {
        let ctx = gpu.context();
        drv("cuCtxSetCurrent", ctx.bind_to_thread())?;
        let bytes = (len.max(1)) * std::mem::size_of::<T>();
        // SAFETY: a plain page-locked allocation of `bytes`; freed once in Drop.
        let raw = drv("cuMemHostAlloc", unsafe { result::malloc_host(bytes, 0) })?;
        let ptr = raw as *mut T;
        for i in 0..len.max(1) {
            // SAFETY: `ptr` holds len.max(1) elements; each is written once
            // before any read.
            unsafe { ptr.add(i).write(T::default()) };
        }
        Ok(PinnedBuf { ctx, ptr, len })
    }
}

impl<T: Copy> PinnedBuf<T> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn as_slice(&self) -> &[T] {
        // SAFETY: `ptr` holds `len` initialised elements owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as above, and &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: Copy> Drop for PinnedBuf<T> {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once here.
        let _ = unsafe { result::free_host(self.ptr as *mut std::ffi::c_void) };
    }
}

/// A kernel argument (passed by value).
#[derive(Clone, Copy, Debug)]
pub enum KArg {
    Ptr(u64),
    I32(i32),
    F32(f32),
    U64(u64),
}

impl KArg {
    /// Size and alignment in bytes of the parameter it passes (the C types
    /// of the `extern "C"` signatures: a pointer or 64-bit integer, an
    /// `int` or `float`).
    pub fn size_align(&self) -> (u32, u32) {
        match self {
            KArg::Ptr(_) | KArg::U64(_) => (8, 8),
            KArg::I32(_) | KArg::F32(_) => (4, 4),
        }
    }
}

/// `(offset, size)` of each argument packed as the compiler lays out a
/// kernel's parameters: each at the next offset its alignment allows.
fn packed(args: &[KArg]) -> impl Iterator<Item = (u32, u32)> + '_ {
    args.iter().scan(0u32, |end, a| {
        let (size, align) = a.size_align();
        let offset = end.next_multiple_of(align);
        *end = offset + size;
        Some((offset, size))
    })
}

/// The parameter buffer `args` pack to (`packed`), ending at the last
/// argument's end.
pub fn packed_layout(args: &[KArg]) -> ParamLayout {
    let params: Vec<(u32, u32)> = packed(args).collect();
    let bytes = params.last().map_or(0, |(o, s)| o + s);
    ParamLayout { bytes, params }
}

/// Whether launches check their argument lists against the cubin's
/// parameter layout (`check_args`): always in debug builds, and in release
/// builds when `GEMTUNE_CHECK_ARGS=1` (how the staged GPU suite runs). Read
/// once.
pub fn launch_args_checked() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        cfg!(debug_assertions) || std::env::var("GEMTUNE_CHECK_ARGS").is_ok_and(|v| v == "1")
    })
}

/// Checks that `args` pack to kernel `kernel`'s parameter buffer `want`
/// (from its cubin): the same bytes and, where the cubin lists its
/// parameters, the same count, offsets and sizes. A mismatch is a
/// calling-convention drift between a `bind` argument list and the
/// kernel's signature.
pub fn check_args(kernel: &str, want: &ParamLayout, args: &[KArg]) -> Result<(), GpuError> {
    // The common case, without allocating: every argument where the cubin
    // has its parameter.
    let mut end = 0u32;
    let mut same = want.params.is_empty() || want.params.len() == args.len();
    for (i, (offset, size)) in packed(args).enumerate() {
        end = offset + size;
        if let Some(&p) = want.params.get(i) {
            same &= p == (offset, size);
        }
    }
    if same && end == want.bytes {
        return Ok(());
    }
    let got = packed_layout(args);
    let describe = |l: &ParamLayout| {
        let p: Vec<String> = l.params.iter().map(|(o, s)| format!("{s}@{o}")).collect();
        format!("{} bytes [{}]", l.bytes, p.join(", "))
    };
    Err(GpuError::Args {
        kernel: kernel.to_string(),
        reason: format!(
            "{} arguments pack to {}, the cubin's {} parameters take {} (size@offset)",
            args.len(),
            describe(&got),
            want.params.len(),
            describe(want)
        ),
    })
}

/// A loaded cubin and its functions.
pub struct Module {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    functions: BTreeMap<String, sys::CUfunction>,
    /// Each entry's parameter buffer, from the cubin (empty if it could not
    /// be read; a note says so).
    params: BTreeMap<String, ParamLayout>,
    /// Differences between the compile-time and the driver's resource
    /// counts, and anything else `Gpu::load` could not take at face value.
    pub attribute_notes: Vec<String>,
}

// SAFETY: a CUmodule and its CUfunctions are driver handles with no thread
// affinity: any thread may use them once the owning context is current
// (every use here binds it first), and the module is unloaded only in Drop.
unsafe impl Send for Module {}
// SAFETY: as above; nothing reachable through &Module mutates the handles.
unsafe impl Sync for Module {}

impl Module {
    /// The entry `name`, one of the kernels `Gpu::load` found in the cubin.
    pub fn function(&self, name: &str) -> Result<sys::CUfunction, GpuError> {
        self.functions.get(name).copied().ok_or_else(|| {
            GpuError::Other(format!(
                "kernel {name} is not in the loaded module (it has: {})",
                self.function_names().join(", ")
            ))
        })
    }
    pub fn function_names(&self) -> Vec<String> {
        self.functions.keys().cloned().collect()
    }
    /// The parameter buffer of entry `name`, as its cubin lays it out.
    pub fn param_layout(&self, name: &str) -> Option<&ParamLayout> {
        self.params.get(name)
    }
    /// `check_args` against entry `name`'s parameters; nothing to check
    /// (Ok) when the cubin's layout could not be read.
    pub fn check_args(&self, name: &str, args: &[KArg]) -> Result<(), GpuError> {
        match self.params.get(name) {
            Some(l) => check_args(name, l, args),
            None => Ok(()),
        }
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: loaded in Gpu::load and unloaded exactly once here.
        let _ = unsafe { result::module::unload(self.module) };
    }
}

/// Raw device memory owned by this handle, allocated and freed in the
/// order of the owning `Gpu`'s stream.
pub struct DeviceBuffer {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn bytes(&self) -> usize {
        self.bytes
    }
    pub fn arg(&self) -> KArg {
        KArg::Ptr(self.ptr)
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated with cuMemAllocAsync on this stream in
        // Gpu::alloc and freed once here, in stream order: work already
        // enqueued on the stream that reads the buffer completes first, and
        // nothing synchronizes. (No buffer is dropped while its stream is
        // being captured: the engine allocates everything before capture.)
        let _ = unsafe { result::free_async(self.ptr, self.stream.cu_stream()) };
    }
}

/// A CUDA event (timing enabled), recorded on a `Gpu`'s stream.
pub struct Event {
    ctx: Arc<CudaContext>,
    pub(crate) ev: sys::CUevent,
}

impl Event {
    /// Milliseconds from `self` to `end`; waits for `end` to complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, GpuError> {
        // SAFETY: both events are live and were recorded on one stream.
        drv("cuEventSynchronize", unsafe {
            result::event::synchronize(end.ev)
        })?;
        drv("cuEventElapsedTime", unsafe {
            result::event::elapsed(self.ev, end.ev)
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: created in Gpu::event, destroyed once.
        let _ = unsafe { result::event::destroy(self.ev) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packing the compiler uses (checked against a cubin in
    /// cubin::tests): each argument at its own alignment, no tail padding.
    #[test]
    fn arguments_pack_at_their_alignment() {
        let args = [
            KArg::Ptr(0),
            KArg::I32(1),
            KArg::F32(2.0),
            KArg::U64(3),
            KArg::I32(4),
            KArg::Ptr(5),
            KArg::I32(6),
        ];
        let l = packed_layout(&args);
        assert_eq!(
            l.params,
            vec![(0, 8), (8, 4), (12, 4), (16, 8), (24, 4), (32, 8), (40, 4)]
        );
        assert_eq!(l.bytes, 44);
        assert_eq!(packed_layout(&[]), ParamLayout::default());
        check_args("k", &l, &args).expect("its own layout");
        let e = check_args("k", &l, &args[..6]).unwrap_err().to_string();
        assert!(e.starts_with("kernel k: "), "{e}");
    }
}
