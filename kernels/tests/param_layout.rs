//! The argument lists of `bind` pack to the parameter buffers of the kernels
//! they launch: for every family and a representative set of its variants,
//! compiled by NVRTC for sm_90 (no GPU needed), every entry a launch uses
//! (main kernel, pre-pass, combine) is checked with `gpu::check_args`
//! against the layout its cubin records (EIATTR_KPARAM_INFO and
//! CBANK_PARAM_SIZE). A calling-convention drift between kernels/src/bind
//! and a kernels/cuda signature fails here, as it fails a debug-build launch
//! on a GPU.

use gemtune_kernels::bind::attention::{combine_kargs, AttnArgs};
use gemtune_kernels::bind::matmul::{Extra, MatmulBinding, Prepass, Tail, TailMode, Weights};
use gemtune_kernels::bind::moe::{
    ExpertWeights, MoeCombineArgs, MoeDownArgs, MoeGateUpArgs, MoeGemmDownArgs, MoeGemmGateUpArgs,
    MoeGroupArgs, MoeRouteArgs,
};
use gemtune_kernels::bind::rows::{
    ActConvertArgs, EmbedArgs, GeluMulArgs, PleArgs, QkNormRopeArgs, RmsNormArgs, RmsNormMoe,
    ScaleExpandArgs, SoftcapArgs,
};
use gemtune_kernels::bind::{Act, ActFormat, NULL};
use gemtune_kernels::compile::{compile, default_cache_dir, nvrtc_available, Arch};
use gemtune_kernels::cubin::{Cubin, ParamLayout};
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::{
    families, AttnProblem, DeviceLimits, Family, KvType, LaunchGeometry, LaunchSequence,
    MoeProblem, Problem, ProblemKind, RowsProblem,
};
use gemtune_kernels::gpu::{check_args, GpuError, KArg};
use gemtune_kernels::quant::GgmlType;

const ARCH: Arch = Arch(90);

fn require_nvrtc() {
    assert!(
        nvrtc_available(),
        "NVRTC (libnvrtc.so) cannot be loaded: install nvidia-cuda-nvrtc==13.0.88 from PyPI and put \
         its lib directory on LD_LIBRARY_PATH (. scripts/nvrtc-env.sh)"
    );
}

/// The defines of `f` for `wt` with `over` applied.
fn variant(f: &dyn Family, wt: GgmlType, over: &[(&str, DefineValue)]) -> Defines {
    let mut d = f.default_defines(wt);
    for (k, v) in over {
        d.insert(k.to_string(), v.clone());
    }
    d
}

fn int(v: i64) -> DefineValue {
    DefineValue::Int(v)
}

fn text(v: &str) -> DefineValue {
    DefineValue::Str(v.to_string())
}

/// The variants checked per family: its defaults and the define changes
/// that change which kernel or which argument list a launch uses.
fn variants(f: &dyn Family) -> Vec<(GgmlType, Vec<(&'static str, DefineValue)>)> {
    let both = |over: Vec<(&'static str, DefineValue)>| {
        vec![(GgmlType::Q8_0, over.clone()), (GgmlType::Q4_0, over)]
    };
    let mut v = both(Vec::new());
    if matches!(f.name(), "gemv" | "gemm_dq" | "gemm_wgmma") {
        // The k-quant planes and the 16-bit weights, each on its defaults
        // (gemv's Q6_K defaults, its GGUF-block path, are added below).
        for wt in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::F16, GgmlType::Bf16] {
            v.push((wt, Vec::new()));
        }
        if f.name() != "gemv" {
            v.push((GgmlType::Q6K, Vec::new()));
        }
    }
    match f.name() {
        "gemv" => {
            v.push((GgmlType::Q6K, Vec::new()));
            v.push((GgmlType::Q8_0, vec![("ALGO", int(0)), ("LAYOUT", int(0))]));
            v.push((GgmlType::Q8_0, vec![("FUSE", int(1)), ("ROWS", int(1))]));
            v.push((GgmlType::Q8_0, vec![("FUSE", int(2))]));
            v.push((GgmlType::Q8_0, vec![("TAIL", int(1))]));
            v.push((
                GgmlType::Q4_0,
                vec![("TAIL", int(1)), ("TAIL_OUT", text("Q8_1"))],
            ));
        }
        "gemm_dq" => v.push((GgmlType::Q8_0, vec![("DQ_TYPE", text("BF16"))])),
        "gemm_wgmma" => v.push((GgmlType::Q8_0, vec![("KSPLIT", int(2))])),
        "rmsnorm" => v.push((GgmlType::Q8_0, vec![("ADD", int(1)), ("OUT", text("Q8_1"))])),
        "qk_norm_rope" => v.push((GgmlType::Q8_0, vec![("Q16", int(1))])),
        "attn_prefill" => {
            v.push((GgmlType::Q8_0, vec![("ALGO", int(0))]));
            v.push((
                GgmlType::Q8_0,
                vec![
                    ("ALGO", int(2)),
                    ("BQ", int(128)),
                    ("BKV", int(64)),
                    ("WD", int(1)),
                    ("Q16", int(1)),
                    ("OUT", text("DQ_F16")),
                ],
            ));
        }
        "scale_expand" => {
            for wt in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
                v.push((wt, Vec::new()));
                v.push((wt, vec![("ALGO", int(1))]));
            }
            v.push((GgmlType::Q8_0, vec![("ALGO", int(1))]));
        }
        "moe_route" => {
            for wt in [GgmlType::F32, GgmlType::F16, GgmlType::Bf16] {
                v.push((wt, Vec::new()));
            }
        }
        "moe_gemv" => {
            v.push((GgmlType::Q8_0, vec![("STAGE", text("DOWN"))]));
            v.push((
                GgmlType::Q4_0,
                vec![("STAGE", text("DOWN")), ("LAYOUT", int(0))],
            ));
            v.push((GgmlType::Q4K, Vec::new()));
            v.push((
                GgmlType::Q8_0,
                vec![("COUNT_BYTES", int(1)), ("ROWS", int(2))],
            ));
            v.push((
                GgmlType::Q8_0,
                vec![("COUNT_BYTES", int(1)), ("STAGE", text("DOWN"))],
            ));
        }
        "moe_gemm" => {
            for st in ["GROUP", "DOWN", "COMBINE"] {
                v.push((GgmlType::Q8_0, vec![("STAGE", text(st))]));
            }
            v.push((GgmlType::Q4K, vec![("DQ_TYPE", text("BF16"))]));
            v.push((GgmlType::F16, vec![("STAGE", text("DOWN"))]));
        }
        "attn_decode" => {
            v.push((GgmlType::Q8_0, vec![("ALGO", int(0))]));
            let stream = |algo: i64, bq: i64, wd: i64| {
                vec![
                    ("ALGO", int(algo)),
                    ("BQ", int(bq)),
                    ("BKV", int(32)),
                    ("KW", int(2)),
                    ("WD", int(wd)),
                    ("STAGES", int(3)),
                ]
            };
            v.push((GgmlType::Q8_0, stream(2, 16, 4)));
            v.push((GgmlType::Q8_0, stream(3, 8, 1)));
            let mut bulk = stream(3, 8, 2);
            bulk.push(("BULK", int(1)));
            v.push((GgmlType::Q8_0, bulk));
        }
        _ => {}
    }
    v
}

/// A problem of the family's kind its variants accept on sm_90.
fn problem(f: &dyn Family, wt: GgmlType) -> Problem {
    let decode = f.name() == "attn_decode";
    match f.problem_kind() {
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
            q_pos0: if decode { 4095 } else { 0 },
            n_q: if decode { 1 } else { 4096 },
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
    }
}

fn attn_args() -> AttnArgs {
    AttnArgs {
        q: NULL,
        k_cache: NULL,
        v_cache: NULL,
        out: NULL,
        pos0_host: 0,
        pos0_dev: NULL,
        n_q: 1,
        capacity: 1,
        n_heads: 1,
        n_kv_heads: 1,
        window: 0,
        scratch: NULL,
    }
}

/// Every launch of one call of `f` with `d` on `p`, as (entry, arguments)
/// built by the `bind` layer (null buffers: only the layout matters).
fn launches(
    f: &dyn Family,
    d: &Defines,
    p: &Problem,
    geo: &LaunchGeometry,
) -> Vec<(String, Vec<KArg>)> {
    let main = geo.kernel.clone();
    let (m, n, k) = match p {
        Problem::Matmul(mp) => (mp.m, mp.n, mp.k),
        _ => (0, 0, 0),
    };
    let f32_act = Act::f32(NULL);
    match f.name() {
        "quantize_q8_1" => {
            let out = Act {
                format: ActFormat::Q8_1,
                data: NULL,
                scales: NULL,
            };
            let args = Prepass::QuantizeQ8_1.kargs(NULL, &out, m, k).expect("a pre-pass");
            vec![(main, args)]
        }
        "gemv" | "mmq" | "gemm_dq" | "gemm_wgmma" => {
            let b = MatmulBinding::of(f.name(), d).expect("binding");
            let w = vec![Weights { q: NULL, d: NULL }; b.matrices];
            let x = Act {
                format: b.act,
                data: NULL,
                scales: NULL,
            };
            let side = b.side.then_some(gemtune_kernels::bind::matmul::Side {
                ptr: NULL,
                stride: n,
            });
            let tail = match b.tail {
                TailMode::None => None,
                mode => Some(Tail {
                    h_in: NULL,
                    h_out: NULL,
                    w_add: NULL,
                    scale: NULL,
                    w_out: NULL,
                    out: Act {
                        format: match mode {
                            TailMode::Norm(f) => f,
                            _ => ActFormat::F32,
                        },
                        data: NULL,
                        scales: NULL,
                    },
                    scratch: NULL,
                    eps: 1e-6,
                }),
            };
            let args = b
                .kargs_with(&w, &x, NULL, m, n, k, Extra { side, tail })
                .expect("kargs");
            let mut out = vec![(main, args)];
            // quantize_q8_1 is a family (and a module) of its own, checked
            // above; gemm_dq_convert is an entry of this module.
            if b.prepass == Prepass::DqConvert {
                let pre = b.prepass_kargs(NULL, &x, m, k).expect("a pre-pass");
                out.push(("gemm_dq_convert".to_string(), pre));
            }
            out
        }
        "act_convert" => vec![(
            main,
            ActConvertArgs {
                x: NULL,
                out: NULL,
                n: 0,
            }
            .kargs(),
        )],
        "scale_expand" => vec![(
            main,
            ScaleExpandArgs {
                src: NULL,
                dst: NULL,
                groups: 0,
            }
            .kargs(),
        )],
        "rmsnorm" => vec![(
            main,
            RmsNormArgs {
                h: NULL,
                y: NULL,
                w_add: NULL,
                scale: NULL,
                w_out: NULL,
                out: f32_act,
                moe: RmsNormMoe::default(),
                rows: 0,
                width: 0,
                eps: 0.0,
            }
            .kargs(),
        )],
        "qk_norm_rope" => vec![(
            main,
            QkNormRopeArgs {
                q_in: NULL,
                q_stride: 0,
                k_in: NULL,
                k_stride: 0,
                v_in: NULL,
                v_stride: 0,
                q_norm: NULL,
                k_norm: NULL,
                inv_freq: NULL,
                pos0: NULL,
                q_out: NULL,
                k_cache: NULL,
                v_cache: NULL,
                capacity: 0,
                rows: 0,
                n_heads: 0,
                n_kv_heads: 0,
                eps: 0.0,
            }
            .kargs(),
        )],
        "gelu_mul" => vec![(
            main,
            GeluMulArgs {
                g: NULL,
                g_stride: 0,
                u: NULL,
                u_stride: 0,
                out: f32_act,
                rows: 0,
                width: 0,
            }
            .kargs(),
        )],
        "embed" => vec![(
            main,
            EmbedArgs {
                tokens: NULL,
                table: NULL,
                side: NULL,
                out: NULL,
                rows: 0,
                width: 0,
                scale: 0.0,
            }
            .kargs(),
        )],
        "ple" => vec![(
            main,
            PleArgs {
                tokens: NULL,
                table: NULL,
                proj: NULL,
                proj_norm: NULL,
                out: NULL,
                rows: 0,
                n_layers: 0,
                ple_dim: 0,
                proj_scale: 0.0,
                tok_scale: 0.0,
                eps: 0.0,
            }
            .kargs(),
        )],
        "softcap" => vec![(
            main,
            SoftcapArgs {
                x: NULL,
                rows: 0,
                width: 0,
                cap: 0.0,
            }
            .kargs(),
        )],
        "attn_prefill" | "attn_decode" => {
            let a = attn_args();
            let mut out = vec![(main, a.kargs())];
            if f.launch_sequence(d).expect("sequence") == (LaunchSequence::Decode { combine: true }) {
                out.push(("attn_combine".to_string(), combine_kargs(&a, 1)));
            }
            out
        }
        "moe_route" => vec![(
            main,
            MoeRouteArgs {
                w: NULL,
                z: NULL,
                scale: NULL,
                logits: NULL,
                ids: NULL,
                weights: NULL,
                counter: NULL,
                d: 0,
                n_experts: 0,
                n_used: 0,
            }
            .kargs(),
        )],
        "moe_gemv" => {
            let w = ExpertWeights { q: NULL, d: NULL };
            let args = if main.starts_with("moe_gemv_gate_up") {
                MoeGateUpArgs {
                    w,
                    x: NULL,
                    ids: NULL,
                    h: NULL,
                    count: NULL,
                    d: 0,
                    ffn: 0,
                    n_experts: 0,
                    n_used: 0,
                }
                .kargs()
            } else {
                MoeDownArgs {
                    w,
                    h: NULL,
                    ids: NULL,
                    weights: NULL,
                    y: NULL,
                    count: NULL,
                    d: 0,
                    ffn: 0,
                    n_experts: 0,
                    n_used: 0,
                }
                .kargs()
            };
            vec![(main, args)]
        }
        "moe_gemm" => {
            let w = ExpertWeights { q: NULL, d: NULL };
            let args = match main.as_str() {
                "moe_gemm_group" => MoeGroupArgs {
                    ids: NULL,
                    counts: NULL,
                    offsets: NULL,
                    sorted: NULL,
                    tiles: NULL,
                    n_tokens: 0,
                    n_experts: 0,
                    n_used: 0,
                    bm: 0,
                }
                .kargs(),
                "moe_gemm_gate_up" => MoeGemmGateUpArgs {
                    w,
                    x: NULL,
                    sorted: NULL,
                    tiles: NULL,
                    offsets: NULL,
                    h: NULL,
                    d: 0,
                    ffn: 0,
                    n_used: 0,
                }
                .kargs(),
                "moe_gemm_down" => MoeGemmDownArgs {
                    w,
                    h: NULL,
                    sorted: NULL,
                    tiles: NULL,
                    offsets: NULL,
                    yp: NULL,
                    d: 0,
                    ffn: 0,
                }
                .kargs(),
                _ => MoeCombineArgs {
                    yp: NULL,
                    ids: NULL,
                    weights: NULL,
                    y: NULL,
                    n_tokens: 0,
                    d: 0,
                    n_experts: 0,
                    n_used: 0,
                }
                .kargs(),
            };
            vec![(main, args)]
        }
        other => panic!(
            "no argument lists for family {other}: add the `bind` calls its launches make to this test"
        ),
    }
}

#[test]
fn every_familys_bind_arguments_match_its_cubins_parameters() {
    require_nvrtc();
    let lim = DeviceLimits::for_arch(ARCH);
    let mut checked = 0;
    for f in families() {
        for (wt, over) in variants(f) {
            let d = variant(f, wt, &over);
            let what = format!("{} {} {:?}", f.name(), wt.name(), over);
            let p = problem(f, wt);
            let geo = f
                .validate(&d, &p, &lim)
                .unwrap_or_else(|r| panic!("{what}: rejected on {ARCH}: {r}"));
            let cv = compile(f, &d, ARCH, default_cache_dir().as_deref())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            let cubin = Cubin::parse(&cv.cubin).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (entry, args) in launches(f, &d, &p, &geo) {
                let k = cubin
                    .kernel(&entry)
                    .unwrap_or_else(|| panic!("{what}: no entry {entry} in the cubin"));
                let layout = k.param_layout();
                assert!(
                    !layout.params.is_empty(),
                    "{what}: {entry} lists no parameters ({k:?})"
                );
                check_args(&entry, &layout, &args).unwrap_or_else(|e| panic!("{what}: {e}"));
                checked += 1;
            }
        }
    }
    assert!(checked >= 40, "only {checked} launches checked");
}

/// A deliberately wrong argument list is refused, naming the kernel: one
/// argument short, one too many, an `int` where the kernel takes a pointer,
/// and a 64-bit count where it takes an `int`.
#[test]
fn wrong_argument_lists_are_refused() {
    require_nvrtc();
    let f = gemtune_kernels::family("gemm_dq").expect("gemm_dq");
    let d = f.default_defines(GgmlType::Q8_0);
    let cv = compile(f, &d, ARCH, default_cache_dir().as_deref()).expect("compile");
    let cubin = Cubin::parse(&cv.cubin).expect("cubin");
    let layout = cubin
        .kernel("gemm_dq")
        .expect("gemm_dq entry")
        .param_layout();
    // gemm_dq(wq, wd, xh, y, M, N, K)
    let good = vec![
        KArg::Ptr(0),
        KArg::Ptr(0),
        KArg::Ptr(0),
        KArg::Ptr(0),
        KArg::I32(1),
        KArg::I32(1),
        KArg::I32(32),
    ];
    check_args("gemm_dq", &layout, &good).expect("the right list");
    let mut short = good.clone();
    short.pop();
    let mut long = good.clone();
    long.push(KArg::I32(0));
    let mut int_for_ptr = good.clone();
    int_for_ptr[3] = KArg::I32(0);
    let mut u64_for_int = good.clone();
    u64_for_int[6] = KArg::U64(32);
    for (what, args) in [
        ("short", short),
        ("long", long),
        ("int for a pointer", int_for_ptr),
        ("u64 for an int", u64_for_int),
    ] {
        match check_args("gemm_dq", &layout, &args) {
            Err(GpuError::Args { kernel, reason }) => {
                assert_eq!(kernel, "gemm_dq", "{what}");
                assert!(reason.contains("bytes"), "{what}: {reason}");
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    // A buffer known only by its size (no KPARAM_INFO) still catches a
    // different byte count.
    let sized = ParamLayout {
        bytes: layout.bytes,
        params: Vec::new(),
    };
    check_args("gemm_dq", &sized, &good).expect("same bytes");
    assert!(check_args("gemm_dq", &sized, &good[..6]).is_err());
}
