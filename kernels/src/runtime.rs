//! The runtime the engine and the harness share: a kernel cache from
//! (family, defines) to a loaded module, resolved kernels that launch with
//! no string work, page-locked staging buffers for asynchronous copies, and
//! CUDA-graph capture and replay of a stream.
//!
//! `check` and `tune` compile and load through the same `compile` path, so a
//! kernel the engine launches is the cubin the harness measured.

use crate::compile::{compile, CompiledVariant};
use crate::cubin::ParamLayout;
use crate::defines::{canonical, Defines};
use crate::device::{LaunchGeometry, LaunchSequence};
pub use crate::gpu::PinnedBuf;
use crate::gpu::{drv, Gpu, GpuError, KArg, Module};
use crate::kernel_family::Family;
use cudarc::driver::{sys, CudaGraph};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A kernel entry resolved once: launching it formats no string and looks
/// nothing up. `geo` is the geometry `Family::validate` gave for the problem
/// the kernel was planned for; callers whose grid varies per call (prefill
/// chunks) pass their own grid to `launch_grid`.
#[derive(Clone)]
pub struct Kernel {
    module: Arc<Module>,
    func: sys::CUfunction,
    pub geo: LaunchGeometry,
    /// `family/defines` (what `run -v` and the phase table print).
    pub label: String,
    /// How the family enqueues this kernel (`Family::launch_sequence`).
    sequence: LaunchSequence,
    /// The entry's parameter buffer from the cubin (None if unreadable):
    /// debug builds (or `GEMTUNE_CHECK_ARGS=1`) check every launch's
    /// arguments against it.
    params: Option<ParamLayout>,
}

// SAFETY: a CUfunction is a handle into a module the Arc keeps loaded; the
// driver API may be called on it from any thread with the context current.
unsafe impl Send for Kernel {}
// SAFETY: as above; launching does not mutate the handle.
unsafe impl Sync for Kernel {}

impl Kernel {
    /// Enqueues one launch with the planned geometry. In debug builds (or
    /// with `GEMTUNE_CHECK_ARGS=1`), arguments that do not pack to the
    /// kernel's parameter buffer are refused (`GpuError::Args`, naming the kernel) before anything is
    /// enqueued; so are they by `launch_dependent` and `launch_grid`.
    pub fn launch(&self, gpu: &Gpu, args: &[KArg]) -> Result<(), GpuError> {
        self.check_args(args)?;
        gpu.launch_function(self.func, &self.geo, args)
    }
    /// Enqueues one launch as a programmatic dependent of the launch before
    /// it (`Gpu::launch_dependent`): the kernel waits for that grid itself.
    pub fn launch_dependent(&self, gpu: &Gpu, args: &[KArg]) -> Result<(), GpuError> {
        self.check_args(args)?;
        gpu.launch_function_dependent(self.func, &self.geo, args)
    }
    /// The entry's parameter buffer, as its cubin lays it out.
    pub fn param_layout(&self) -> Option<&ParamLayout> {
        self.params.as_ref()
    }
    /// Refuses `args` that do not pack to the cubin's parameter buffer: in
    /// debug builds always, in release builds when `GEMTUNE_CHECK_ARGS=1`
    /// (so a staged release suite can run with the check on).
    fn check_args(&self, args: &[KArg]) -> Result<(), GpuError> {
        match &self.params {
            Some(l) if crate::gpu::launch_args_checked() => {
                crate::gpu::check_args(&self.geo.kernel, l, args)
            }
            _ => Ok(()),
        }
    }
    /// Enqueues one launch with `grid` in place of the planned grid.
    pub fn launch_grid(
        &self,
        gpu: &Gpu,
        grid: (u32, u32, u32),
        args: &[KArg],
    ) -> Result<(), GpuError> {
        self.launch_grid_as(gpu, grid, args, false)
    }
    /// `launch_grid`, as a programmatic dependent of the launch before it
    /// when `dependent` (as `launch_dependent`).
    pub fn launch_grid_as(
        &self,
        gpu: &Gpu,
        grid: (u32, u32, u32),
        args: &[KArg],
        dependent: bool,
    ) -> Result<(), GpuError> {
        self.check_args(args)?;
        let geo = LaunchGeometry {
            grid,
            ..self.geo.clone()
        };
        if dependent {
            gpu.launch_function_dependent(self.func, &geo, args)
        } else {
            gpu.launch_function(self.func, &geo, args)
        }
    }
    /// The same function with another geometry (a prefill chunk's grid).
    pub fn with_geometry(&self, geo: LaunchGeometry) -> Kernel {
        Kernel {
            geo,
            ..self.clone()
        }
    }
    /// The loaded module (other entries of the same cubin, e.g. a pre-pass).
    pub fn module(&self) -> &Arc<Module> {
        &self.module
    }
    /// How the kernel's family enqueues it (what `bind`'s launch functions
    /// follow); `Single` for a sibling.
    pub fn sequence(&self) -> LaunchSequence {
        self.sequence
    }
    /// Whether the module has an entry `name`.
    pub fn has_sibling(&self, name: &str) -> bool {
        self.module.function(name).is_ok()
    }
    /// Another entry of the same module, with its own geometry.
    pub fn sibling(&self, geo: LaunchGeometry) -> Result<Kernel, GpuError> {
        let func = self.module.function(&geo.kernel)?;
        Ok(Kernel {
            module: self.module.clone(),
            func,
            label: format!("{} [{}]", self.label, geo.kernel),
            params: self.module.param_layout(&geo.kernel).cloned(),
            geo,
            sequence: LaunchSequence::Single,
        })
    }
}

/// Compiles (through the on-disk cubin cache) and loads each distinct
/// (family, defines) once, and hands out resolved kernels.
pub struct KernelCache {
    cache_dir: Option<PathBuf>,
    modules: Mutex<HashMap<String, Arc<Module>>>,
    compiled: Mutex<Vec<Arc<CompiledVariant>>>,
}

impl KernelCache {
    /// A cache that compiles into `cache_dir` (None: `default_cache_dir()`).
    pub fn new(cache_dir: Option<PathBuf>) -> KernelCache {
        KernelCache {
            cache_dir: cache_dir.or_else(crate::compile::default_cache_dir),
            modules: Mutex::new(HashMap::new()),
            compiled: Mutex::new(Vec::new()),
        }
    }

    /// The loaded module of (family, defines) on `gpu`.
    pub fn module(
        &self,
        gpu: &Gpu,
        family: &dyn Family,
        defines: &Defines,
    ) -> Result<Arc<Module>, GpuError> {
        let key = format!("{}|{}", family.name(), canonical(defines));
        if let Some(m) = self.lock_modules().get(&key) {
            return Ok(m.clone());
        }
        let cv = compile(family, defines, gpu.arch(), self.cache_dir.as_deref())?;
        let m = Arc::new(gpu.load(&cv)?);
        self.compiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::new(cv));
        self.lock_modules().insert(key, m.clone());
        Ok(m)
    }

    /// Compiles the (family, defines) pairs not loaded yet in one compile
    /// pool (`crate::pool`: cold compiles in parallel, results identical to
    /// `module`'s) and loads them, so a caller that knows its kernels up
    /// front (the engine's load-time plan) pays the slowest compile instead
    /// of the sum. A pair that fails to compile or load is left out; the
    /// later `module` or `kernel` call for it reports the error. Returns the
    /// pool's report.
    pub fn prefetch(
        &self,
        gpu: &Gpu,
        wanted: &[(&dyn Family, Defines)],
    ) -> crate::pool::PoolReport {
        let mut keys = std::collections::HashSet::new();
        let jobs: Vec<crate::pool::CompileJob> = {
            let loaded = self.lock_modules();
            wanted
                .iter()
                .filter(|(f, d)| {
                    let key = format!("{}|{}", f.name(), canonical(d));
                    !loaded.contains_key(&key) && keys.insert(key)
                })
                .map(|(f, d)| crate::pool::CompileJob {
                    family: *f,
                    defines: d.clone(),
                    arch: gpu.arch(),
                })
                .collect()
        };
        let (results, report) =
            crate::pool::compile_all(&jobs, self.cache_dir.as_deref(), None, None, |_, _| {});
        for (job, r) in jobs.iter().zip(results) {
            let Ok(cv) = r else { continue };
            let Ok(m) = gpu.load(&cv) else { continue };
            let key = format!("{}|{}", job.family.name(), canonical(&job.defines));
            self.compiled
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Arc::new(cv));
            self.lock_modules().insert(key, Arc::new(m));
        }
        report
    }

    /// The kernel `geo.kernel` of (family, defines), resolved.
    pub fn kernel(
        &self,
        gpu: &Gpu,
        family: &dyn Family,
        defines: &Defines,
        geo: LaunchGeometry,
    ) -> Result<Kernel, GpuError> {
        let sequence = family
            .launch_sequence(defines)
            .map_err(|r| GpuError::Rejected(format!("{}: {r}", family.name())))?;
        let module = self.module(gpu, family, defines)?;
        let func = module.function(&geo.kernel)?;
        Ok(Kernel {
            params: module.param_layout(&geo.kernel).cloned(),
            module,
            func,
            label: format!("{}/{}", family.name(), canonical(defines)),
            geo,
            sequence,
        })
    }

    /// Every variant compiled so far (resources for reports).
    pub fn compiled(&self) -> Vec<Arc<CompiledVariant>> {
        self.compiled
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock_modules(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Module>>> {
        self.modules.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A captured, instantiated CUDA graph of a `Gpu`'s stream.
pub struct Graph {
    inner: CudaGraph,
    /// Times `launch` was called (tests assert replays happened).
    replays: std::sync::atomic::AtomicU64,
}

impl Graph {
    /// Replays the graph on the stream it was captured from.
    pub fn launch(&self) -> Result<(), GpuError> {
        self.replays
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        drv("cuGraphLaunch", self.inner.launch())
    }
    pub fn replays(&self) -> u64 {
        self.replays.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Gpu {
    /// Starts capturing this GPU's stream (thread-local mode: other threads'
    /// unrelated CUDA calls stay legal). Everything enqueued until
    /// `end_capture` becomes the graph instead of running.
    pub fn begin_capture(&self) -> Result<(), GpuError> {
        drv(
            "cuStreamBeginCapture",
            self.cuda_stream()
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
        )
    }

    /// Ends the capture and instantiates the graph.
    pub fn end_capture(&self) -> Result<Graph, GpuError> {
        let g = drv(
            "cuStreamEndCapture",
            self.cuda_stream()
                .end_capture(sys::CUgraphInstantiate_flags(0)),
        )?
        .ok_or_else(|| GpuError::Other("stream capture produced an empty graph".into()))?;
        drv("cuGraphUpload", g.upload())?;
        Ok(Graph {
            inner: g,
            replays: std::sync::atomic::AtomicU64::new(0),
        })
    }
}
