//! Every family's default defines compile through NVRTC for sm_80, sm_89 and
//! sm_90 with zero spills; the `Defines:` header blocks match the `#error`
//! guards. No GPU needed; NVRTC must be loadable (CI installs it from PyPI).

use gemtune_kernels::compile::{compile, nvrtc_available, nvrtc_version, Arch};
use gemtune_kernels::family::{families, DeviceLimits, Problem};
use gemtune_kernels::quant::GgmlType;
use gemtune_kernels::source::{header_defines, required_macros, source, SOURCES};

fn require_nvrtc() {
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc.so) cannot be loaded: install nvidia-cuda-nvrtc==13.0.88 from PyPI and put \
         its lib directory on LD_LIBRARY_PATH (see TEAM.md / .ci/run)"
    );
}

#[test]
fn defaults_compile_for_every_arch_without_spills() {
    require_nvrtc();
    let v = nvrtc_version().expect("nvrtc version");
    assert!(v.0 >= 12, "NVRTC {v:?} is too old");
    for arch in [Arch(80), Arch(89), Arch(90)] {
        for f in families() {
            for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
                let d = f.default_defines(wt);
                let cv = compile(f, &d, arch, None)
                    .unwrap_or_else(|e| panic!("{} {} {arch}: {e}", f.name(), wt.name()));
                assert!(!cv.cubin.is_empty());
                assert!(
                    !cv.functions.is_empty(),
                    "{}: no functions parsed from log:\n{}",
                    f.name(),
                    cv.log
                );
                for fr in &cv.functions {
                    assert_eq!(
                        fr.spill_bytes,
                        0,
                        "{} {} {arch}: {} spills {} bytes\n{}",
                        f.name(),
                        wt.name(),
                        fr.name,
                        fr.spill_bytes,
                        cv.log
                    );
                    assert!(fr.registers > 0 && fr.registers <= 255, "{fr:?}");
                    println!(
                        "{arch} {:14} {:5} {:10} regs {:3} smem {:5} stack {}",
                        f.name(),
                        wt.name(),
                        fr.name,
                        fr.registers,
                        fr.static_smem,
                        fr.stack_bytes
                    );
                }
                // The defaults target the H100: they must be a valid point there.
                let p = Problem::matmul(if f.name() == "gemv" { 1 } else { 256 }, 1024, 2560, wt);
                f.validate(&d, &p, &DeviceLimits::for_arch(Arch(90)))
                    .unwrap_or_else(|r| {
                        panic!(
                            "{} {}: defaults rejected on sm_90: {r}",
                            f.name(),
                            wt.name()
                        )
                    });
            }
        }
    }
}

#[test]
fn compile_error_carries_family_defines_and_log() {
    require_nvrtc();
    let f = gemtune_kernels::family("mmq").unwrap();
    let mut d = f.default_defines(GgmlType::Q8_0);
    d.remove("BK");
    let e = compile(f, &d, Arch(90), None).unwrap_err().to_string();
    assert!(e.contains("mmq ["), "{e}");
    assert!(e.contains("BM=128"), "{e}");
    assert!(e.contains("mmq.cu needs BK"), "{e}");
}

#[test]
fn undeclared_define_is_rejected_before_nvrtc() {
    let f = gemtune_kernels::family("gemv").unwrap();
    let mut d = f.default_defines(GgmlType::Q8_0);
    d.insert("NOPE".into(), 1i64.into());
    let e = compile(f, &d, Arch(90), None).unwrap_err().to_string();
    assert!(e.contains("define NOPE is not declared in gemv.cu"), "{e}");
}

#[test]
fn cache_round_trip() {
    require_nvrtc();
    let dir = tempfile::tempdir().unwrap();
    let f = gemtune_kernels::family("quantize_q8_1").unwrap();
    let d = f.default_defines(GgmlType::Q8_0);
    let a = compile(f, &d, Arch(89), Some(dir.path())).unwrap();
    assert!(!a.from_cache);
    let b = compile(f, &d, Arch(89), Some(dir.path())).unwrap();
    assert!(b.from_cache);
    assert_eq!(a.cubin, b.cubin);
    assert_eq!(a.cache_key, b.cache_key);
    assert_eq!(a.registers, b.registers);
    let c = compile(f, &d, Arch(90), Some(dir.path())).unwrap();
    assert_ne!(a.cache_key, c.cache_key);
}

#[test]
fn defines_blocks_match_error_guards() {
    for (name, text) in SOURCES {
        let declared = header_defines(text);
        let required = required_macros(text);
        for r in &required {
            assert!(
                declared.contains(r),
                "{name}: #error guard for {r} but {r} is not in the Defines: block"
            );
        }
        for d in &declared {
            assert!(
                required.contains(d),
                "{name}: {d} is in the Defines: block but has no #ifndef/#error guard"
            );
        }
    }
    // Every family's source declares what its defaults set, and nothing else.
    for f in families() {
        let declared = header_defines(source(f.source_file()).unwrap());
        let d = f.default_defines(GgmlType::Q8_0);
        let keys: Vec<String> = d.keys().cloned().collect();
        let mut sorted = declared.clone();
        sorted.sort();
        assert_eq!(keys, sorted, "{}: defaults vs Defines: block", f.name());
    }
}
