//! NVRTC compilation of (family, defines, arch) to a cubin, with an on-disk
//! cache and per-function resource usage.
//!
//! Resources come from `--ptxas-options=-v` so they are known without a GPU
//! (compile-only CI); `Gpu::load` cross-checks them with `cuFuncGetAttribute`.
//! The cubin itself (`crate::cubin`) is the authority on which kernels exist:
//! when the log does not describe every one of them, the compile is retried
//! once, and if the log is still incomplete the counts are read from the
//! cubin instead (see [`ResourceSource`]). Such recoveries are counted per
//! process ([`take_recoveries`]) rather than printed per variant. Many
//! compiles at once go through `crate::pool`.

pub use crate::cubin::FunctionResources;
use crate::cubin::{Cubin, CubinError};
use crate::defines::{canonical, to_options, Defines};
pub use crate::device::Arch;
use crate::source;
use cudarc::nvrtc::sys as nvrtc_sys;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::ffi::{c_char, CString};
use std::fmt;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The SM architectures the loaded NVRTC can compile for, ascending.
pub fn supported_archs() -> Result<Vec<Arch>, CompileError> {
    if !nvrtc_available() {
        return Err(no_nvrtc());
    }
    let mut n: std::ffi::c_int = 0;
    // SAFETY: the library is present (checked above); `n` is valid for writes.
    let r = unsafe { nvrtc_sys::nvrtcGetNumSupportedArchs(&mut n) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || n <= 0 {
        return Err(CompileError::NoNvrtc(format!(
            "nvrtcGetNumSupportedArchs returned {r:?}"
        )));
    }
    let mut v: Vec<std::ffi::c_int> = vec![0; n as usize];
    // SAFETY: `v` holds the `n` elements NVRTC said it would write.
    let r = unsafe { nvrtc_sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CompileError::NoNvrtc(format!(
            "nvrtcGetSupportedArchs returned {r:?}"
        )));
    }
    let mut archs: Vec<Arch> = v.into_iter().map(|x| Arch(x as u32)).collect();
    archs.sort();
    archs.dedup();
    Ok(archs)
}

/// Parses `--arch` and checks it against what the loaded NVRTC supports;
/// the error names every valid value.
pub fn parse_target_arch(s: &str) -> Result<Arch, String> {
    let supported = supported_archs().map_err(|e| e.to_string())?;
    let list = || {
        let plain: Vec<String> = supported.iter().map(|a| a.to_string()).collect();
        let specific: Vec<String> = supported
            .iter()
            .filter(|a| a.0 >= 90)
            .map(|a| format!("{a}a"))
            .collect();
        format!("{} (and {})", plain.join(", "), specific.join(", "))
    };
    let a: Arch = s
        .parse()
        .map_err(|e: String| format!("{e}; NVRTC here targets {}", list()))?;
    if s.ends_with('a') && a.0 < 90 {
        return Err(format!(
            "'{s}': arch-specific targets start at sm_90a; NVRTC here targets {}",
            list()
        ));
    }
    if !supported.contains(&a) {
        return Err(format!(
            "NVRTC {} cannot target '{s}'; it targets {}",
            nvrtc_version()
                .map(|(a, b)| format!("{a}.{b}"))
                .unwrap_or_default(),
            list()
        ));
    }
    Ok(a)
}

/// Where a compiled variant's resource counts came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceSource {
    /// The ptxas `-v` log, which listed every kernel of the cubin.
    #[default]
    PtxasLog,
    /// The cubin's attributes, because the log stayed incomplete after a
    /// retry. Registers, stack frame and static shared memory are exact;
    /// spill bytes are not recorded in a cubin and hold its local-memory
    /// bound instead (`cubin::KernelInfo::local_bound`: zero only when no
    /// spill is possible).
    Cubin,
}

impl fmt::Display for ResourceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ResourceSource::PtxasLog => "ptxas log",
            ResourceSource::Cubin => "cubin",
        })
    }
}

/// A compiled variant: the cubin plus its per-function resources. The
/// scalar resource fields are the maximum over the module's functions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompiledVariant {
    #[serde(skip)]
    pub cubin: Vec<u8>,
    pub family: String,
    pub defines: Defines,
    pub arch: Arch,
    pub cache_key: String,
    pub registers: u32,
    pub spill_bytes: u32,
    pub static_smem: u32,
    pub functions: Vec<FunctionResources>,
    pub nvrtc_version: (i32, i32),
    pub log: String,
    pub from_cache: bool,
    /// Set when writing the cache entry failed (the compile still succeeded).
    pub cache_warning: Option<String>,
    /// Where `functions` (and the maxima above) came from.
    #[serde(default)]
    pub resources_source: ResourceSource,
    /// Set when the first ptxas log did not describe every kernel of the
    /// cubin (what was missing, and what the retry gave), or when the cubin's
    /// attributes could not be read. Also counted in the process's
    /// [`Recoveries`], which a command summarises in one line.
    #[serde(default)]
    pub resources_note: Option<String>,
}

impl CompiledVariant {
    /// Resources of one function by name.
    pub fn function(&self, name: &str) -> Option<&FunctionResources> {
        self.functions.iter().find(|f| f.name == name)
    }
}

/// Why a variant did not compile. Callers report it and go on with the other
/// variants.
#[derive(Debug, Error)]
pub enum CompileError {
    #[error("{family} [{defines}]: NVRTC compile failed for {arch}:\n{log}")]
    Nvrtc {
        family: String,
        defines: String,
        arch: Arch,
        log: String,
    },
    #[error("{family} [{defines}]: {reason}")]
    Invalid {
        family: String,
        defines: String,
        reason: String,
    },
    #[error("NVRTC is not available: {0}")]
    NoNvrtc(String),
    /// Not compiled: a compile pool was stopped before this job's turn.
    #[error("{family} [{defines}]: not compiled (stopped before its turn)")]
    NotRun { family: String, defines: String },
    /// The compile succeeded but neither the ptxas log nor the cubin gave
    /// the kernels' resources.
    #[error("{family} [{defines}] {arch}: no resource counts: {reason}")]
    Resources {
        family: String,
        defines: String,
        arch: Arch,
        reason: String,
    },
}

/// The cubin cache: `$GEMTUNE_CACHE_DIR`, else `$XDG_CACHE_HOME/gemtune/cubin`,
/// else `~/.cache/gemtune/cubin`; `None` if none can be determined. Entries
/// are keyed by source, defines, arch and NVRTC version, so a stale entry is
/// never served; deleting the directory is always safe.
pub fn default_cache_dir() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|p| !p.is_empty());
    if let Some(p) = var("GEMTUNE_CACHE_DIR") {
        return Some(PathBuf::from(p));
    }
    if let Some(p) = var("XDG_CACHE_HOME") {
        return Some(PathBuf::from(p).join("gemtune/cubin"));
    }
    var("HOME").map(|h| PathBuf::from(h).join(".cache/gemtune/cubin"))
}

/// Whether the NVRTC shared library can be loaded.
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen the library; no symbol is called.
    unsafe { nvrtc_sys::is_culib_present() }
}

/// The NVRTC version, or NoNvrtc if the library cannot be loaded.
pub fn nvrtc_version() -> Result<(i32, i32), CompileError> {
    if !nvrtc_available() {
        return Err(no_nvrtc());
    }
    let (mut major, mut minor) = (0i32, 0i32);
    // SAFETY: the library is present (checked above); both out-pointers are
    // valid for writes.
    let r = unsafe { nvrtc_sys::nvrtcVersion(&mut major, &mut minor) };
    if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
        return Err(CompileError::NoNvrtc(format!(
            "nvrtcVersion returned {r:?}"
        )));
    }
    Ok((major, minor))
}

fn no_nvrtc() -> CompileError {
    let path = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    CompileError::NoNvrtc(format!(
        "libnvrtc.so / libnvrtc.so.13 is neither on LD_LIBRARY_PATH ({}) nor in the \
         system library directories. Install it with \
         `pip install nvidia-cuda-nvrtc==13.0.88` and put its lib directory on LD_LIBRARY_PATH \
         (`. scripts/nvrtc-env.sh` does both)",
        if path.is_empty() { "unset" } else { &path }
    ))
}

/// NVRTC options used for every variant (besides defines and the arch).
pub const BASE_OPTIONS: &[&str] = &[
    "-std=c++17",
    "--ptxas-options=-v",
    "-lineinfo",
    "--diag-suppress=177",
];

/// What `compile` needs to know of a kernel source, for one define set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceSpec {
    /// The family name (labels errors and the cache entry).
    pub family: &'static str,
    /// File under `kernels/cuda/`.
    pub file: &'static str,
    /// The macro names the source's `Defines:` header block declares.
    pub declared: Vec<String>,
    /// The architecture whose arch-specific target (`sm_XXa`) these defines
    /// need, if any.
    pub arch_specific: Option<Arch>,
}

/// A compilable kernel source: every `Family` is one (`kernel_family`
/// implements this for them), so `compile` takes a family without this
/// module depending on the family abstraction.
pub trait CompileSource {
    /// The source facts for the define set `d`.
    fn source_spec(&self, d: &Defines) -> SourceSpec;
}

/// Compiles a family's source with `d` for `arch`, through the cache at
/// `cache` when given. Undeclared defines are rejected before NVRTC runs.
pub fn compile<F: CompileSource + ?Sized>(
    f: &F,
    d: &Defines,
    arch: Arch,
    cache: Option<&Path>,
) -> Result<CompiledVariant, CompileError> {
    let spec = f.source_spec(d);
    let invalid = |reason: String| CompileError::Invalid {
        family: spec.family.to_string(),
        defines: canonical(d),
        reason,
    };
    if let Some(k) = d.keys().find(|k| !spec.declared.contains(k)) {
        return Err(invalid(format!(
            "define {k} is not declared in {}'s Defines: block (declared: {})",
            spec.file,
            spec.declared.join(", ")
        )));
    }
    let text = source::resolve(spec.file).map_err(invalid)?;
    let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    let target = match spec.arch_specific {
        None => arch.to_string(),
        Some(a) if a == arch => format!("{arch}a"),
        Some(a) => {
            return Err(invalid(format!(
                "{} uses {a}a-specific instructions and cannot be compiled for {arch}",
                spec.file
            )))
        }
    };
    options.push(format!("--gpu-architecture={target}"));
    options.extend(to_options(d).map_err(invalid)?);
    compile_source(spec.family, spec.file, &text, d, &options, arch, cache)
}

/// Compiles already-resolved source text (used by `compile` and by internal
/// kernels such as the bandwidth stream).
pub(crate) fn compile_source(
    family: &str,
    file: &str,
    text: &str,
    d: &Defines,
    options: &[String],
    arch: Arch,
    cache: Option<&Path>,
) -> Result<CompiledVariant, CompileError> {
    let version = nvrtc_version()?;
    let key = cache_key(text, d, options, arch, version);
    if let Some(dir) = cache {
        if let Some(cv) = read_cache(dir, &key) {
            return Ok(cv);
        }
    }
    let nvrtc_err = |log| CompileError::Nvrtc {
        family: family.to_string(),
        defines: canonical(d),
        arch,
        log,
    };
    with_recoveries(|r| r.fresh += 1);
    let (cubin, log) = nvrtc_compile(text, file, options).map_err(nvrtc_err)?;
    // The retry compiles a copy made unique by an empty probe kernel: NVRTC
    // serves a program it has compiled before from the CUDA compute cache
    // (~/.nv/ComputeCache) without running ptxas, and then `-v` prints
    // nothing. The probe changes the PTX, so ptxas runs and reports every
    // kernel; the kernels' code is unchanged, so the first cubin is kept and
    // only the log is taken from the copy.
    let first_cubin = cubin.clone();
    let run = || {
        let (probe_text, probe) = with_log_probe(text);
        nvrtc_compile(&probe_text, file, options)
            .map(|(_, log)| (first_cubin, without_function(&log, &probe)))
            .map_err(nvrtc_err)
    };
    dump_if_asked(family, arch, &key, text, options, &cubin, &log);
    let Settled {
        cubin,
        log,
        functions,
        source,
        note,
        recovery,
    } = settle_resources(cubin, log, run, |reason| CompileError::Resources {
        family: family.to_string(),
        defines: canonical(d),
        arch,
        reason,
    })?;
    if let (Some(kind), Some(n)) = (recovery, &note) {
        record_recovery(kind, &format!("{family} [{}] {arch}: {n}", canonical(d)));
    }
    let mut cv = CompiledVariant {
        cubin,
        family: family.to_string(),
        defines: d.clone(),
        arch,
        cache_key: key.clone(),
        registers: functions.iter().map(|f| f.registers).max().unwrap_or(0),
        spill_bytes: functions.iter().map(|f| f.spill_bytes).max().unwrap_or(0),
        static_smem: functions.iter().map(|f| f.static_smem).max().unwrap_or(0),
        functions,
        nvrtc_version: version,
        log,
        from_cache: false,
        cache_warning: None,
        resources_source: source,
        resources_note: note,
    };
    if let Some(dir) = cache {
        if let Err(e) = write_cache(dir, &key, &cv) {
            let w = format!(
                "warning: cubin cache write to {} failed: {e}",
                dir.display()
            );
            record_recovery(Recovery::CacheWriteFailed, &w);
            cv.cache_warning = Some(w);
        }
    }
    Ok(cv)
}

/// An internal recovery of one compile: the compile succeeded, but not on
/// the plain path. Counted per process (`recoveries`) and reported in one
/// summary line per command, not per variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recovery {
    /// The first ptxas log missed kernels (empty when NVRTC answered from
    /// the CUDA compute cache); the retry's log was complete.
    LogRetried,
    /// The retry's log was incomplete too; resources read from the cubin.
    FromCubin,
    /// The cubin's attributes could not be read; resources from the log.
    CubinUnreadable,
    /// The cubin cache entry could not be written (the compile is kept).
    CacheWriteFailed,
}

/// Recoveries counted since the last `take_recoveries`, with the first
/// message of each kind (what a user would look at first).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recoveries {
    /// Fresh compiles (not served by the cubin cache).
    pub fresh: u64,
    pub log_retried: u64,
    pub from_cubin: u64,
    pub cubin_unreadable: u64,
    pub cache_write_failed: u64,
    /// First message of each kind counted, in the order counted.
    pub first: Vec<String>,
}

impl Recoveries {
    fn count(&mut self, kind: Recovery, message: &str) {
        let n = match kind {
            Recovery::LogRetried => &mut self.log_retried,
            Recovery::FromCubin => &mut self.from_cubin,
            Recovery::CubinUnreadable => &mut self.cubin_unreadable,
            Recovery::CacheWriteFailed => &mut self.cache_write_failed,
        };
        *n += 1;
        if *n == 1 {
            self.first.push(message.to_string());
        }
    }

    /// One line for the end of a command, or `None` when nothing was
    /// recovered. Only the kinds that occurred are named; the cubin fallback
    /// and a failed cache write also quote their first message, since they
    /// change what a report shows (spill bytes from the cubin's bound) or
    /// what the next run costs.
    pub fn summary(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.log_retried > 0 {
            parts.push(format!(
                "{} compiled a second time for a complete ptxas report (the first came back empty or partial, as when the CUDA compute cache serves it; the numbers are ptxas's)",
                self.log_retried
            ));
        }
        if self.from_cubin > 0 {
            parts.push(format!(
                "{} took their resources from the cubin (spill bytes are its local-memory bound)",
                self.from_cubin
            ));
        }
        if self.cubin_unreadable > 0 {
            parts.push(format!(
                "{} had unreadable cubin attributes (resources from the ptxas log)",
                self.cubin_unreadable
            ));
        }
        if self.cache_write_failed > 0 {
            parts.push(format!(
                "{} could not be written to the cubin cache",
                self.cache_write_failed
            ));
        }
        if parts.is_empty() {
            return None;
        }
        let mut line = format!(
            "compile: of {} fresh compiles, {}",
            self.fresh,
            parts.join("; ")
        );
        let quoted: Vec<&String> = self
            .first
            .iter()
            .filter(|m| !m.contains("the retry's log was complete"))
            .collect();
        if let Some(m) = quoted.first() {
            line.push_str(&format!(". First: {m}"));
        }
        Some(line)
    }
}

static RECOVERIES: std::sync::Mutex<Recoveries> = std::sync::Mutex::new(Recoveries {
    fresh: 0,
    log_retried: 0,
    from_cubin: 0,
    cubin_unreadable: 0,
    cache_write_failed: 0,
    first: Vec::new(),
});

fn with_recoveries<T>(f: impl FnOnce(&mut Recoveries) -> T) -> T {
    f(&mut RECOVERIES.lock().unwrap_or_else(|p| p.into_inner()))
}

fn record_recovery(kind: Recovery, message: &str) {
    with_recoveries(|r| r.count(kind, message));
}

/// The recoveries counted so far in this process, and a fresh count from now
/// on (a command prints `summary()` of what it took once, at its end).
pub fn take_recoveries() -> Recoveries {
    with_recoveries(std::mem::take)
}

/// A compile's final cubin and log with the resources taken from them.
struct Settled {
    cubin: Vec<u8>,
    log: String,
    functions: Vec<FunctionResources>,
    source: ResourceSource,
    note: Option<String>,
    recovery: Option<Recovery>,
}

/// Picks the resource source for a successful compile: the ptxas log when it
/// describes every kernel of the cubin; otherwise one more compile (`retry`),
/// and if that log is incomplete too, the cubin's attributes. `unresolved`
/// builds the error for the case where neither source can be used.
fn settle_resources<E>(
    cubin: Vec<u8>,
    log: String,
    retry: impl FnOnce() -> Result<(Vec<u8>, String), E>,
    unresolved: impl FnOnce(String) -> E,
) -> Result<Settled, E> {
    let parsed = Cubin::parse(&cubin);
    let functions = parse_ptxas_log(&log);
    let Some(first) = log_gap(&log, &functions, &parsed) else {
        let note = parsed.err().map(|e| {
            format!("the cubin's attributes are unreadable ({e}); resources from the ptxas log")
        });
        return Ok(Settled {
            cubin,
            log,
            functions,
            source: ResourceSource::PtxasLog,
            recovery: note.as_ref().map(|_| Recovery::CubinUnreadable),
            note,
        });
    };
    // The log misses a kernel the cubin holds: compile once more (the caller's
    // retry makes the program unique, so ptxas runs and reports), and fall
    // back to the cubin's attributes only if that log is incomplete too. The
    // note records which path was taken.
    let (cubin, log) = retry()?;
    let parsed = Cubin::parse(&cubin);
    let functions = parse_ptxas_log(&log);
    let (functions, source, recovery, note) = match (log_gap(&log, &functions, &parsed), parsed) {
        (None, _) => (
            functions,
            ResourceSource::PtxasLog,
            Recovery::LogRetried,
            format!("{first} on the first compile; the retry's log was complete"),
        ),
        (Some(second), Ok(c)) => (
            c.resources(),
            ResourceSource::Cubin,
            Recovery::FromCubin,
            format!(
                "{first} on the first compile and {second} on the retry; resources read from \
                 the cubin (spill bytes = its local-memory bound, spills not being recorded there)"
            ),
        ),
        (Some(second), Err(e)) => {
            return Err(unresolved(format!(
                "{first} on the first compile, {second} on the retry, and the cubin's \
                 attributes are unreadable: {e}"
            )))
        }
    };
    Ok(Settled {
        cubin,
        log,
        functions,
        source,
        note: Some(note),
        recovery: Some(recovery),
    })
}

/// What the ptxas log fails to describe, if anything: kernels the cubin holds
/// that the log does not list or, when the cubin cannot be read, the absence
/// of any function in the log.
fn log_gap(
    log: &str,
    functions: &[FunctionResources],
    cubin: &Result<Cubin, CubinError>,
) -> Option<String> {
    let missing: Vec<&str> = match cubin {
        Ok(c) => c
            .kernels
            .iter()
            .filter(|k| !functions.iter().any(|f| f.name == k.name))
            .map(|k| k.name.as_str())
            .collect(),
        Err(_) if functions.is_empty() => vec!["any function"],
        Err(_) => Vec::new(),
    };
    if missing.is_empty() {
        None
    } else if log.trim().is_empty() {
        Some("the ptxas log was empty".into())
    } else {
        Some(format!(
            "the ptxas log ({} bytes) did not list {}",
            log.len(),
            missing.join(", ")
        ))
    }
}

/// sha256 over everything that can change the produced cubin.
pub fn cache_key(
    text: &str,
    d: &Defines,
    options: &[String],
    arch: Arch,
    version: (i32, i32),
) -> String {
    let mut h = Sha256::new();
    // The tag versions the cache entry's layout (the JSON of CompiledVariant
    // and how its resources were obtained): entries written under another
    // tag are never read.
    h.update(b"gemtune-cubin-v2\0");
    h.update(text.as_bytes());
    h.update(b"\0");
    h.update(canonical(d).as_bytes());
    h.update(b"\0");
    h.update(options.join("\x1f").as_bytes());
    h.update(format!("\0{arch}\0{}.{}", version.0, version.1).as_bytes());
    hex::encode(h.finalize())
}

fn read_cache(dir: &Path, key: &str) -> Option<CompiledVariant> {
    let meta = std::fs::read(dir.join(format!("{key}.json"))).ok()?;
    let cubin = std::fs::read(dir.join(format!("{key}.cubin"))).ok()?;
    let mut cv: CompiledVariant = serde_json::from_slice(&meta).ok()?;
    if cv.cache_key != key || cubin.is_empty() {
        return None;
    }
    cv.cubin = cubin;
    cv.from_cache = true;
    cv.cache_warning = None;
    Some(cv)
}

fn write_cache(dir: &Path, key: &str, cv: &CompiledVariant) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let meta = serde_json::to_vec_pretty(cv).map_err(std::io::Error::other)?;
    // Write to unique temporaries, then rename: concurrent writers of the same
    // key produce identical bytes, and readers never see a half-written file.
    let tmp = |ext: &str| dir.join(format!("{key}.{ext}.tmp{}", std::process::id()));
    std::fs::write(tmp("cubin"), &cv.cubin)?;
    std::fs::rename(tmp("cubin"), dir.join(format!("{key}.cubin")))?;
    std::fs::write(tmp("json"), meta)?;
    std::fs::rename(tmp("json"), dir.join(format!("{key}.json")))?;
    Ok(())
}

fn cstring_lossy(bytes: Vec<c_char>) -> String {
    let b: Vec<u8> = bytes
        .into_iter()
        .map(|c| c as u8)
        .take_while(|&c| c != 0)
        .collect();
    String::from_utf8_lossy(&b).into_owned()
}

/// Name prefix of the empty kernel `with_log_probe` appends.
pub(crate) const LOG_PROBE_PREFIX: &str = "gemtune_log_probe_";

/// `text` plus an empty kernel whose name is unique in this process (and
/// across processes by the pid), so NVRTC cannot answer the compile from the
/// CUDA compute cache and ptxas prints its `-v` report. Returns the text and
/// the probe kernel's name.
pub(crate) fn with_log_probe(text: &str) -> (String, String) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "{LOG_PROBE_PREFIX}{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    (
        format!("{text}\nextern \"C\" __global__ void {name}() {{}}\n"),
        name,
    )
}

/// `log` without the ptxas report of function `name` (from its "Compiling
/// entry function" line up to the next function's), so a log taken from the
/// probe compile describes exactly the kernels of the kept cubin.
fn without_function(log: &str, name: &str) -> String {
    let entry = format!("Compiling entry function '{name}'");
    let props = format!("Function properties for {name}");
    let mut out = String::with_capacity(log.len());
    let mut skipping = false;
    for line in log.lines() {
        // A report group starts at either header line; only the probe's own
        // groups are dropped (the probe is empty and calls nothing, so no
        // callee group can follow it).
        if line.contains("Compiling entry function") || line.contains("Function properties for ") {
            skipping = line.contains(&entry) || line.trim_end().ends_with(&props);
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Runs NVRTC; Ok((cubin, log)) or Err(log).
fn nvrtc_compile(text: &str, file: &str, options: &[String]) -> Result<(Vec<u8>, String), String> {
    use cudarc::nvrtc::result as nr;
    let src = CString::new(text).map_err(|_| "source contains a NUL byte".to_string())?;
    let name = CString::new(file).map_err(|_| "file name contains a NUL byte".to_string())?;
    let prog =
        nr::create_program(&src, Some(&name)).map_err(|e| format!("nvrtcCreateProgram: {e}"))?;
    // SAFETY: `prog` was just created and is destroyed exactly once below;
    // `src` and `name` outlive it.
    let res = unsafe { nr::compile_program(prog, options) };
    // SAFETY: as above.
    let log = unsafe { nr::get_program_log(prog) }
        .map(cstring_lossy)
        .unwrap_or_default();
    let out = match res {
        Err(e) => Err(format!("{e}\n{log}")),
        Ok(()) => {
            let mut size = 0usize;
            // SAFETY: `prog` compiled successfully; `size` is a valid out-pointer.
            let r = unsafe { nvrtc_sys::nvrtcGetCUBINSize(prog, &mut size) };
            if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS || size == 0 {
                Err(format!(
                    "nvrtcGetCUBINSize returned {r:?} (was the arch a virtual compute_XX?)\n{log}"
                ))
            } else {
                let mut cubin = vec![0u8; size];
                // SAFETY: `cubin` has exactly the size NVRTC reported.
                let r =
                    unsafe { nvrtc_sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char) };
                if r != nvrtc_sys::nvrtcResult::NVRTC_SUCCESS {
                    Err(format!("nvrtcGetCUBIN returned {r:?}\n{log}"))
                } else {
                    Ok((cubin, log))
                }
            }
        }
    };
    // SAFETY: `prog` is valid and not used after this.
    let _ = unsafe { nr::destroy_program(prog) };
    out
}

/// With `GEMTUNE_DUMP_DIR` set, every fresh compilation leaves its source,
/// options, NVRTC log and cubin there (for inspecting a variant with
/// cuobjdump/nvdisasm, or a compiler that behaves differently on another host).
/// Failures to write are reported on stderr and otherwise ignored.
fn dump_if_asked(
    family: &str,
    arch: Arch,
    key: &str,
    text: &str,
    options: &[String],
    cubin: &[u8],
    log: &str,
) {
    let Some(dir) = std::env::var_os("GEMTUNE_DUMP_DIR") else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let stem = format!("{family}-{arch}-{}", &key[..key.len().min(12)]);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(format!("{stem}.cu")), text)?;
        std::fs::write(dir.join(format!("{stem}.opts")), options.join("\n"))?;
        std::fs::write(dir.join(format!("{stem}.log")), log)?;
        std::fs::write(dir.join(format!("{stem}.cubin")), cubin)
    };
    if let Err(e) = write() {
        eprintln!("warning: GEMTUNE_DUMP_DIR {}: {e}", dir.display());
    }
}

/// Parses ptxas `-v` output into per-function resources.
///
/// Lines of interest (one group per function):
/// `ptxas info    : Compiling entry function 'gemv_n1' for 'sm_90'`,
/// `ptxas info    : Function properties for gemv_n1`,
/// `    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads`,
/// `ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]`.
///
/// A device function that was not inlined gets its own "Function
/// properties" group after an entry's. Its stack frame is not the entry's
/// (the cubin's FRAME_SIZE of the entry does not include it either), but its
/// spill stores count toward the entry listed before it: the log does not say
/// which kernel calls it, and a spill must not go unreported.
pub fn parse_ptxas_log(log: &str) -> Vec<FunctionResources> {
    let mut out: Vec<FunctionResources> = Vec::new();
    let num_before = |s: &str, unit: &str| -> Option<u32> {
        let i = s.find(unit)?;
        s[..i].split_whitespace().last()?.parse().ok()
    };
    // Whether the next "stack frame" line describes the current entry itself.
    let mut props_of_entry = true;
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(FunctionResources {
                name,
                ..Default::default()
            });
            props_of_entry = true;
            continue;
        }
        if let Some(i) = line.find("Function properties for ") {
            let name = line[i + "Function properties for ".len()..].trim();
            props_of_entry = out.last().is_some_and(|f| f.name == name);
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            let spill = num_before(line, "bytes spill stores").unwrap_or(0);
            cur.spill_bytes = cur.spill_bytes.max(spill);
            if props_of_entry {
                cur.stack_bytes = num_before(line, "bytes stack frame").unwrap_or(0);
            }
        } else if line.contains("Used ") && line.contains("registers") {
            cur.registers = num_before(line, "registers").unwrap_or(0);
            cur.static_smem = num_before(line, "bytes smem").unwrap_or(0);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_parses() {
        assert_eq!("sm_90".parse::<Arch>().unwrap(), Arch(90));
        assert_eq!("89".parse::<Arch>().unwrap(), Arch(89));
        assert!("compute_90".parse::<Arch>().is_err());
        assert_eq!(Arch(80).to_string(), "sm_80");
    }

    #[test]
    fn ptxas_log_parses() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'gemv_n1' for 'sm_90'\n\
ptxas info    : Function properties for gemv_n1\n\
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n\
ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'gemv_n2' for 'sm_90'\n\
ptxas info    : Function properties for gemv_n2\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 64 registers, used 0 barriers, 380 bytes cmem[0]\n\
ptxas info    : Function properties for _Z3recPKii\n\
    136 bytes stack frame, 20 bytes spill stores, 20 bytes spill loads\n";
        let f = parse_ptxas_log(log);
        assert_eq!(f.len(), 2);
        assert_eq!(
            f[0],
            FunctionResources {
                name: "gemv_n1".into(),
                registers: 40,
                spill_bytes: 8,
                stack_bytes: 24,
                static_smem: 4096
            }
        );
        assert_eq!(f[1].registers, 64);
        assert_eq!(f[1].static_smem, 0);
        // The callee's frame is its own; its spills are charged to gemv_n2.
        assert_eq!(f[1].stack_bytes, 0);
        assert_eq!(f[1].spill_bytes, 20);
    }

    #[test]
    fn cache_key_depends_on_every_input() {
        let d = crate::defines::defines([("A", 1i64)]);
        let o = vec!["-x".to_string()];
        let k = cache_key("src", &d, &o, Arch(90), (13, 0));
        assert_ne!(k, cache_key("src2", &d, &o, Arch(90), (13, 0)));
        assert_ne!(
            k,
            cache_key(
                "src",
                &crate::defines::defines([("A", 2i64)]),
                &o,
                Arch(90),
                (13, 0)
            )
        );
        assert_ne!(k, cache_key("src", &d, &o, Arch(89), (13, 0)));
        assert_ne!(k, cache_key("src", &d, &o, Arch(90), (13, 1)));
        assert_eq!(k.len(), 64);
    }

    /// Two kernels, one with static shared memory.
    const TWO: &str = r#"
extern "C" __global__ void k_a(float* o) { o[threadIdx.x] = 1.0f; }
extern "C" __global__ void k_b(float* o) {
    __shared__ float s[64];
    s[threadIdx.x % 64] = threadIdx.x;
    __syncthreads();
    o[threadIdx.x] = s[(threadIdx.x + 1) % 64];
}
"#;

    fn compile_two() -> (Vec<u8>, String) {
        assert!(
            nvrtc_available(),
            "NVRTC is needed (. scripts/nvrtc-env.sh)"
        );
        let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
        options.push("--gpu-architecture=sm_90".into());
        // A unique copy per call: a repeated program may come from the CUDA
        // compute cache with an empty log, and these tests need a real one.
        let (text, _) = with_log_probe(TWO);
        nvrtc_compile(&text, "two.cu", &options).unwrap()
    }

    type Settle = Result<Settled, String>;

    fn settle_with(cubin: Vec<u8>, log: &str, retry: Option<(Vec<u8>, String)>) -> (Settle, bool) {
        let called = std::cell::Cell::new(false);
        let r = settle_resources(
            cubin,
            log.to_string(),
            || {
                called.set(true);
                retry.ok_or_else(|| "no retry expected".to_string())
            },
            |reason| format!("unresolved: {reason}"),
        );
        (r, called.get())
    }

    #[test]
    fn complete_log_is_used_without_retry() {
        let (cubin, log) = compile_two();
        let (r, retried) = settle_with(cubin, &log, None);
        let s = r.unwrap();
        assert!(!retried);
        assert_eq!(s.source, ResourceSource::PtxasLog);
        assert_eq!(s.note, None);
        // k_a, k_b and the probe kernel that made the compile unique.
        assert_eq!(s.functions.len(), 3);
        assert!(s
            .functions
            .iter()
            .any(|f| f.name.starts_with(LOG_PROBE_PREFIX)));
    }

    #[test]
    fn probe_report_is_cut_from_the_log() {
        let log = "ptxas info    : 0 bytes gmem\n\
ptxas info    : Compiling entry function 'gemtune_log_probe_1_0' for 'sm_90'\n\
ptxas info    : Function properties for gemtune_log_probe_1_0\n\
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 4 registers, used 0 barriers, 352 bytes cmem[0]\n\
ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
ptxas info    : Function properties for k\n\
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
ptxas info    : Used 20 registers, used 0 barriers, 360 bytes cmem[0]\n";
        let cut = without_function(log, "gemtune_log_probe_1_0");
        let f = parse_ptxas_log(&cut);
        assert_eq!(f.len(), 1);
        assert_eq!(
            (f[0].name.as_str(), f[0].registers, f[0].stack_bytes),
            ("k", 20, 8)
        );
        assert!(cut.starts_with("ptxas info    : 0 bytes gmem\n"));
        // A callee's group after the probe's keeps its spill report.
        let with_callee = format!(
            "{log}ptxas info    : Function properties for helper\n    \
             16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads\n"
        );
        let cut = without_function(&with_callee, "gemtune_log_probe_1_0");
        assert!(cut.contains("12 bytes spill stores"), "{cut}");
    }

    #[test]
    fn a_repeated_program_still_reports_its_resources() {
        // Where the CUDA compute cache is active, the second compile of an
        // identical program comes back with an empty log; the probe retry
        // must still give ptxas's numbers, not the cubin's.
        let f = crate::family("quantize_q8_1").unwrap();
        let d = f.default_defines(crate::quant::GgmlType::Q8_0);
        let a = compile(f, &d, Arch(90), None).unwrap();
        let b = compile(f, &d, Arch(90), None).unwrap();
        for cv in [&a, &b] {
            assert_eq!(
                cv.resources_source,
                ResourceSource::PtxasLog,
                "{:?}",
                cv.resources_note
            );
            assert!(!cv.functions.is_empty());
            assert!(cv
                .functions
                .iter()
                .all(|f| !f.name.starts_with(LOG_PROBE_PREFIX)));
        }
        assert_eq!(a.cubin, b.cubin);
        assert_eq!(a.functions, b.functions);
    }

    #[test]
    fn empty_log_is_retried_once() {
        let (cubin, log) = compile_two();
        let (r, retried) = settle_with(cubin.clone(), "", Some((cubin, log.clone())));
        let s = r.unwrap();
        assert!(retried);
        assert_eq!(s.source, ResourceSource::PtxasLog);
        assert_eq!(s.log, log);
        let note = s.note.unwrap();
        assert!(
            note.contains(
                "the ptxas log was empty on the first compile; the retry's log was complete"
            ),
            "{note}"
        );
    }

    #[test]
    fn incomplete_logs_fall_back_to_the_cubin() {
        let (cubin, log) = compile_two();
        let from_cubin = crate::cubin::Cubin::parse(&cubin).unwrap().resources();
        // Empty twice.
        let (r, _) = settle_with(cubin.clone(), "", Some((cubin.clone(), String::new())));
        let s = r.unwrap();
        assert_eq!(s.source, ResourceSource::Cubin);
        assert_eq!(s.functions, from_cubin);
        let note = s.note.unwrap();
        assert!(
            note.contains("empty on the first compile and the ptxas log was empty on the retry"),
            "{note}"
        );
        let b = s.functions.iter().find(|f| f.name == "k_b").unwrap();
        assert_eq!(b.static_smem, 256);
        // A log that lists only one of the two kernels, twice.
        let cut = log
            .split("Compiling entry function")
            .take(2)
            .collect::<Vec<_>>()
            .join("Compiling entry function");
        assert_eq!(parse_ptxas_log(&cut).len(), 1);
        let (r, _) = settle_with(cubin.clone(), &cut, Some((cubin, cut.clone())));
        let s = r.unwrap();
        assert_eq!(s.source, ResourceSource::Cubin);
        assert!(s.note.unwrap().contains("did not list"));
    }

    #[test]
    fn recoveries_are_summarised_in_one_line() {
        let mut r = Recoveries::default();
        assert_eq!(r.summary(), None);
        r.fresh = 176;
        r.count(
            Recovery::LogRetried,
            "attn_decode [A=1] sm_90: the ptxas log was empty on the first compile; the retry's log was complete",
        );
        r.count(Recovery::LogRetried, "another");
        let line = r.summary().unwrap();
        assert!(
            line.starts_with("compile: of 176 fresh compiles, 2 compiled a second time"),
            "{line}"
        );
        // A routine retry is counted, not quoted.
        assert!(!line.contains("attn_decode"), "{line}");
        assert!(!line.contains('\n'));
        r.count(
            Recovery::FromCubin,
            "gemv [B=2] sm_80: ... resources read from the cubin",
        );
        r.count(
            Recovery::CacheWriteFailed,
            "warning: cubin cache write to /x failed: denied",
        );
        let line = r.summary().unwrap();
        assert!(
            line.contains("1 took their resources from the cubin"),
            "{line}"
        );
        assert!(
            line.contains("1 could not be written to the cubin cache"),
            "{line}"
        );
        assert!(
            line.ends_with("First: gemv [B=2] sm_80: ... resources read from the cubin"),
            "{line}"
        );
        assert_eq!(r.first.len(), 3, "one first message per kind");
    }

    #[test]
    fn settle_reports_the_recovery_it_took() {
        let (cubin, log) = compile_two();
        let (r, _) = settle_with(cubin.clone(), &log, None);
        assert_eq!(r.unwrap().recovery, None);
        let (r, _) = settle_with(cubin.clone(), "", Some((cubin.clone(), log.clone())));
        assert_eq!(r.unwrap().recovery, Some(Recovery::LogRetried));
        let (r, _) = settle_with(cubin.clone(), "", Some((cubin, String::new())));
        assert_eq!(r.unwrap().recovery, Some(Recovery::FromCubin));
        let (r, _) = settle_with(b"junk".to_vec(), &log, None);
        assert_eq!(r.unwrap().recovery, Some(Recovery::CubinUnreadable));
    }

    #[test]
    fn unreadable_cubin_and_empty_logs_are_an_error() {
        let (_, log) = compile_two();
        let junk = b"not an elf".to_vec();
        let (r, _) = settle_with(junk.clone(), "", Some((junk.clone(), String::new())));
        let e = r.err().unwrap();
        assert!(e.starts_with("unresolved: the ptxas log was empty"), "{e}");
        assert!(e.contains("not a cubin"), "{e}");
        // With a complete log the log is used, and the note says why the
        // cubin was no help.
        let (r, retried) = settle_with(junk, &log, None);
        let s = r.unwrap();
        assert!(!retried);
        assert_eq!(s.source, ResourceSource::PtxasLog);
        assert!(s.note.unwrap().contains("unreadable"));
    }
}
