//! NVRTC compilation of (family, defines, arch) to a cubin, with an on-disk
//! cache and per-function resource usage read from the ptxas log.
//!
//! Resources come from `--ptxas-options=-v` so they are known without a GPU
//! (compile-only CI); `Gpu::load` cross-checks them with `cuFuncGetAttribute`.

use crate::defines::{canonical, to_options, Defines};
use crate::family::Family;
use crate::source;
use cudarc::nvrtc::sys as nvrtc_sys;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::ffi::{c_char, CString};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use thiserror::Error;

/// A CUDA compute capability as an SM number: 80 (A100), 89 (Ada), 90 (H100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Arch(pub u32);

impl Arch {
    /// Shared memory a block may opt in to on this architecture, in bytes;
    /// used by `validate` when no GPU is present.
    pub fn max_smem_optin(self) -> u32 {
        match self.0 {
            90.. => 227 * 1024,
            80 | 87 => 163 * 1024,
            86 | 89 => 99 * 1024,
            75 => 64 * 1024,
            _ => 48 * 1024,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sm_{}", self.0)
    }
}

impl FromStr for Arch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let digits = s.strip_prefix("sm_").unwrap_or(s);
        match digits.parse::<u32>() {
            Ok(v) if (50..=130).contains(&v) => Ok(Arch(v)),
            _ => Err(format!("'{s}' is not an SM architecture like sm_90")),
        }
    }
}

/// Resources of one kernel function of a compiled module (from ptxas).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionResources {
    pub name: String,
    pub registers: u32,
    /// Bytes of spill stores (local memory written because registers ran out).
    pub spill_bytes: u32,
    /// Stack frame bytes (local arrays plus spills).
    pub stack_bytes: u32,
    pub static_smem: u32,
}

/// A compiled variant: the cubin plus what ptxas reported about it. The
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
}

/// `$GEMTUNE_CACHE`, else `~/.cache/gemtune/cubin`; `None` if neither can be
/// determined.
pub fn default_cache_dir() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("GEMTUNE_CACHE") {
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gemtune/cubin"))
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
    CompileError::NoNvrtc(
        "libnvrtc.so could not be loaded; install it (pip install nvidia-cuda-nvrtc==13.0.88) \
         and add its lib directory to LD_LIBRARY_PATH"
            .into(),
    )
}

/// NVRTC options used for every variant (besides defines and the arch).
pub const BASE_OPTIONS: &[&str] = &[
    "-std=c++17",
    "--ptxas-options=-v",
    "-lineinfo",
    "--diag-suppress=177",
];

/// Compiles a family's source with `d` for `arch`, through the cache at
/// `cache` when given. Undeclared defines are rejected before NVRTC runs.
pub fn compile(
    f: &dyn Family,
    d: &Defines,
    arch: Arch,
    cache: Option<&Path>,
) -> Result<CompiledVariant, CompileError> {
    let invalid = |reason: String| CompileError::Invalid {
        family: f.name().to_string(),
        defines: canonical(d),
        reason,
    };
    let declared = f.declared_defines();
    if let Some(k) = d.keys().find(|k| !declared.contains(k)) {
        return Err(invalid(format!(
            "define {k} is not declared in {}'s Defines: block (declared: {})",
            f.source_file(),
            declared.join(", ")
        )));
    }
    let text = source::resolve(f.source_file()).map_err(invalid)?;
    let mut options: Vec<String> = BASE_OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture={arch}"));
    options.extend(to_options(d).map_err(invalid)?);
    compile_source(f.name(), f.source_file(), &text, d, &options, arch, cache)
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
    let (cubin, log) = nvrtc_compile(text, file, options).map_err(|log| CompileError::Nvrtc {
        family: family.to_string(),
        defines: canonical(d),
        arch,
        log,
    })?;
    dump_if_asked(family, arch, &key, text, options, &cubin, &log);
    let functions = parse_ptxas_log(&log);
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
    };
    if let Some(dir) = cache {
        if let Err(e) = write_cache(dir, &key, &cv) {
            let w = format!(
                "warning: cubin cache write to {} failed: {e}",
                dir.display()
            );
            eprintln!("{w}");
            cv.cache_warning = Some(w);
        }
    }
    Ok(cv)
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
    h.update(b"gemtune-cubin-v1\0");
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
/// `    24 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads`,
/// `ptxas info    : Used 40 registers, used 1 barriers, 4096 bytes smem, 380 bytes cmem[0]`.
pub fn parse_ptxas_log(log: &str) -> Vec<FunctionResources> {
    let mut out: Vec<FunctionResources> = Vec::new();
    let num_before = |s: &str, unit: &str| -> Option<u32> {
        let i = s.find(unit)?;
        s[..i].split_whitespace().last()?.parse().ok()
    };
    for line in log.lines() {
        if let Some(i) = line.find("Compiling entry function '") {
            let rest = &line[i + "Compiling entry function '".len()..];
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(FunctionResources {
                name,
                ..Default::default()
            });
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            cur.stack_bytes = num_before(line, "bytes stack frame").unwrap_or(0);
            cur.spill_bytes = num_before(line, "bytes spill stores").unwrap_or(0);
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
ptxas info    : Used 64 registers, used 0 barriers, 380 bytes cmem[0]\n";
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
}
