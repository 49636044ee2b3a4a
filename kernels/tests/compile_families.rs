//! Every family's default defines compile through NVRTC for sm_80, sm_89 and
//! sm_90 with zero spills, and the cubin's own resource attributes agree with
//! the ptxas log; the `Defines:` header blocks match the `#error` guards. No
//! GPU needed; NVRTC must be loadable (CI installs it from PyPI).

use gemtune_kernels::compile::{
    compile, nvrtc_available, nvrtc_version, parse_ptxas_log, Arch, ResourceSource,
};
use gemtune_kernels::cubin::{entry_names, Cubin};
use gemtune_kernels::family::{
    families, AttnProblem, DeviceLimits, KvType, MoeProblem, Problem, ProblemKind, RowsProblem,
};
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
            if f.arch_specific().is_some_and(|a| a != arch) {
                continue;
            }
            for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
                let d = f.default_defines(wt);
                let what = format!("{arch} {} {}", f.name(), wt.name());
                let cv = compile(f, &d, arch, None).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert!(!cv.cubin.is_empty());
                // An incomplete ptxas log (empty when the CUDA compute cache
                // served the program) is retried and, failing that, replaced
                // by the cubin's counts; the note says which happened.
                if let Some(note) = &cv.resources_note {
                    println!(
                        "NOTE {what}: {note} [resources from the {}]",
                        cv.resources_source
                    );
                }
                let cubin = Cubin::parse(&cv.cubin);
                assert!(
                    !cv.functions.is_empty(),
                    "{what}: no functions in the ptxas log nor in the cubin ({}):\n{}",
                    match &cubin {
                        Ok(c) => format!("{} kernel(s)", c.kernels.len()),
                        Err(e) => e.to_string(),
                    },
                    cv.log
                );
                if let Ok(c) = &cubin {
                    for k in &c.kernels {
                        assert!(
                            cv.function(&k.name).is_some(),
                            "{what}: kernel {} of the cubin has no resources",
                            k.name
                        );
                    }
                }
                for fr in &cv.functions {
                    assert_eq!(
                        fr.spill_bytes, 0,
                        "{what}: {} spills {} bytes (resources from the {})\n{}",
                        fr.name, fr.spill_bytes, cv.resources_source, cv.log
                    );
                    assert!(fr.registers > 0 && fr.registers <= 255, "{what}: {fr:?}");
                    println!(
                        "{arch} {:14} {:5} {:16} regs {:3} smem {:5} stack {} ({})",
                        f.name(),
                        wt.name(),
                        fr.name,
                        fr.registers,
                        fr.static_smem,
                        fr.stack_bytes,
                        cv.resources_source
                    );
                }
                // The defaults target the H100: they must be a valid point
                // there, on an E4B-sized problem of the family's kind.
                let p = match f.problem_kind() {
                    ProblemKind::Matmul => {
                        Problem::matmul(if f.name() == "gemv" { 1 } else { 256 }, 1024, 2560, wt)
                    }
                    ProblemKind::Rows => Problem::Rows(RowsProblem {
                        rows: 512,
                        width: 2560,
                        dtype: wt,
                        aux: 256,
                    }),
                    ProblemKind::Attention => Problem::Attention(AttnProblem {
                        n_heads: 8,
                        n_kv_heads: 2,
                        head_dim: 256,
                        window: 0,
                        q_pos0: if f.name() == "attn_decode" { 4095 } else { 0 },
                        n_q: if f.name() == "attn_decode" { 1 } else { 4096 },
                        capacity: 4096,
                        kv_type: KvType::F16,
                    }),
                    ProblemKind::Moe => Problem::Moe(MoeProblem {
                        tokens: 1,
                        d_model: 2816,
                        ffn: 704,
                        experts: 128,
                        used: 8,
                        wtype: wt,
                    }),
                };
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

/// The Q6_K GEMV (the tied head of Q4_0 files) compiles without spills on
/// every architecture at the points the profiles and the spec use, and Q6_K
/// GGUF super-blocks (LAYOUT=0) with a dp4a or fused define set stop at the
/// source's guard (Q6_K planes, LAYOUT=1, take both: the compile report
/// holds every spec point of every type to zero spills).
#[test]
fn gemv_q6k_compiles_without_spills() {
    require_nvrtc();
    let f = gemtune_kernels::family("gemv").unwrap();
    for arch in [Arch(80), Arch(89), Arch(90)] {
        for (rows, warps, unroll) in [(1i64, 4i64, 1i64), (2, 4, 1), (2, 2, 1)] {
            let mut d = f.default_defines(GgmlType::Q6K);
            d.insert("ROWS".into(), rows.into());
            d.insert("WARPS".into(), warps.into());
            d.insert("UNROLL".into(), unroll.into());
            let what = format!("{arch} gemv Q6_K ROWS={rows} WARPS={warps} UNROLL={unroll}");
            let cv = compile(f, &d, arch, None).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(cv.functions.len(), 8, "{what}: gemv_n1..gemv_n8");
            for fr in &cv.functions {
                assert_eq!(fr.spill_bytes, 0, "{what}: {} spills", fr.name);
                println!("{what}: {} regs {}", fr.name, fr.registers);
            }
        }
        for (name, v) in [("ALGO", 1i64), ("FUSE", 1)] {
            let mut d = f.default_defines(GgmlType::Q6K);
            d.insert(name.into(), v.into());
            let e = compile(f, &d, arch, None).expect_err(name).to_string();
            assert!(
                e.contains("Q6_K GGUF super-blocks (LAYOUT=0) need ALGO=0 and FUSE=0"),
                "{name}: {e}"
            );
        }
    }
}

/// The cubin's attributes and ptxas's log agree, kernel for kernel, on
/// every family's defaults: the fallback used when the log is incomplete
/// gives the numbers the log would have.
#[test]
fn cubin_resources_match_ptxas_for_defaults() {
    require_nvrtc();
    let mut checked = 0;
    for arch in [Arch(80), Arch(89), Arch(90)] {
        for f in families() {
            if f.arch_specific().is_some_and(|a| a != arch) {
                continue;
            }
            for wt in [GgmlType::Q8_0, GgmlType::Q4_0] {
                let what = format!("{arch} {} {}", f.name(), wt.name());
                let cv = compile(f, &f.default_defines(wt), arch, None)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                if cv.resources_source != ResourceSource::PtxasLog {
                    println!("SKIP {what}: no complete ptxas log to compare with");
                    continue;
                }
                let c = Cubin::parse(&cv.cubin).unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(c.sm, arch.0, "{what}");
                let log = parse_ptxas_log(&cv.log);
                let diffs = c.differences(&log);
                assert!(diffs.is_empty(), "{what}: {diffs:#?}\n{}", cv.log);
                let mut names: Vec<String> = entry_names(&cv.cubin).unwrap();
                let mut logged: Vec<String> = log.iter().map(|f| f.name.clone()).collect();
                names.sort();
                logged.sort();
                assert_eq!(names, logged, "{what}");
                checked += c.kernels.len();
            }
        }
    }
    assert!(checked > 0);
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
