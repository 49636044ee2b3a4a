//! Spec and shapes parsing, errors with file:line, sweep expansion and ids,
//! and the per-shape plan that lists rejected points.

use gemtune::spec::{self, FamilySpec, ShapesFile};

const SPEC: &str = r#"# a test spec
[kernel]
family = "mmq"
contract = "approx"

[defaults]
BM = 128
BN = 128
BK = 64
WARPS_M = 2
WARPS_N = 4
STAGES = 3
CP_ASYNC = 1
EPI = 1

[[variant]]
name = "baseline"
defines = { BM = 64, BN = 64, STAGES = 1 }

[[variant]]
name = "big"
defines = { BN = 256 }

[[sweep]]
base = ["big"]
STAGES = [2, 3]
BM = [64, 128]

[[sweep]]
base = ["baseline", "big"]
EPI = [0, 1]
"#;

fn parse(text: &str) -> Result<FamilySpec, spec::SpecError> {
    FamilySpec::parse("variants/mmq.toml", text)
}

#[test]
fn parses_defaults_variants_and_sweeps() {
    let s = parse(SPEC).expect("valid spec");
    assert_eq!(s.family, "mmq");
    assert_eq!(s.family_line, 3);
    assert_eq!(s.defaults.len(), 8);
    assert_eq!(s.variants.len(), 2);
    assert_eq!(s.variants[1].line, 21);
    assert_eq!(s.sweeps.len(), 2);
    assert_eq!(s.sweeps[0].axes.len(), 2);
    assert_eq!(s.sweeps[0].axes[0].name, "STAGES");
    assert_eq!(s.sha256.len(), 64);
}

#[test]
fn unknown_key_names_file_and_line() {
    let text = SPEC.replace(
        "contract = \"approx\"",
        "contract = \"approx\"\ncolor = \"red\"",
    );
    let e = parse(&text).unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line, e.col),
        ("variants/mmq.toml", 5, 1)
    );
    assert!(e.msg.contains("unknown key `color` in [kernel]"), "{e}");
    assert!(
        e.to_string()
            .starts_with("variants/mmq.toml:5:1: unknown key `color`"),
        "{e}"
    );

    let text = SPEC.replace("name = \"big\"", "name = \"big\"\nthreads = 4");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.line, 22, "{e}");
    assert!(
        e.msg.contains("unknown key `threads` in [[variant]]"),
        "{e}"
    );

    let text = format!("{SPEC}\n[extra]\nx = 1\n");
    let e = parse(&text).unwrap_err();
    assert_eq!(e.line, 33, "{e}");
    assert!(e.msg.contains("unknown key `extra`"), "{e}");
}

#[test]
fn undeclared_define_names_file_and_line() {
    let declared: Vec<String> = [
        "WTYPE", "BM", "BN", "BK", "WARPS_M", "WARPS_N", "STAGES", "CP_ASYNC", "EPI",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    parse(SPEC)
        .unwrap()
        .check_declared(&declared, "mmq.cu")
        .expect("all declared");

    let text = SPEC.replace(
        "defines = { BN = 256 }",
        "defines = { BN = 256, SWIZZLE = 1 }",
    );
    let e = parse(&text)
        .unwrap()
        .check_declared(&declared, "mmq.cu")
        .unwrap_err();
    assert_eq!((e.line, e.col), (22, 23), "{e}");
    assert!(
        e.msg
            .starts_with("define SWIZZLE is not declared in mmq.cu's Defines: block"),
        "{e}"
    );

    let text = SPEC.replace("EPI = [0, 1]", "EPI = [0, 1]\nFOO = [1]");
    let e = parse(&text)
        .unwrap()
        .check_declared(&declared, "mmq.cu")
        .unwrap_err();
    assert_eq!(e.line, 32, "{e}");

    // Against the real registered family too (its Defines: block).
    let f = gemtune_kernels::family::family("mmq").expect("mmq is registered");
    let text = SPEC.replace("EPI = 1\n", "EPI = 1\nNOT_A_DEFINE = 3\n");
    let e = spec::check_against_family(&parse(&text).unwrap(), f).unwrap_err();
    assert_eq!(e.line, 15, "{e}");
    assert!(e.msg.contains("NOT_A_DEFINE"), "{e}");
}

#[test]
fn structural_errors_are_located() {
    let e = parse(&SPEC.replace("name = \"baseline\"", "name = \"base\"")).unwrap_err();
    assert!(e.msg.contains("no [[variant]] named `baseline`"), "{e}");
    let e = parse(&SPEC.replace("base = [\"big\"]", "base = [\"huge\"]")).unwrap_err();
    assert_eq!(e.line, 25, "{e}");
    assert!(
        e.msg.contains("sweep base `huge` names no [[variant]]"),
        "{e}"
    );
    let e = parse(&SPEC.replace("BM = 128\n", "BM = 1.5\n")).unwrap_err();
    assert_eq!(e.line, 7, "{e}");
    let e = parse(&SPEC.replace("BK = 64\n", "WTYPE = \"Q8_0\"\n")).unwrap_err();
    assert!(e.msg.contains("set from each shape's type"), "{e}");
    let e = parse(&SPEC.replace("contract = \"approx\"", "contract = \"exact\"")).unwrap_err();
    assert_eq!(e.line, 4, "{e}");
    let e = parse("[kernel\nfamily = 1").unwrap_err();
    assert_eq!(e.line, 1, "{e}");
    assert!(e.msg.starts_with("TOML syntax"), "{e}");
}

#[test]
fn sweep_expansion_counts_and_stable_ids() {
    let s = parse(SPEC).unwrap();
    let pts = spec::expand(&s);
    // 2 named + 4 (big x STAGES x BM) + 2 bases x 2 EPI = 10 ids.
    assert_eq!(pts.len(), 10);
    let ids: Vec<&str> = pts.iter().map(|p| p.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            "baseline",
            "big",
            "big+BM=64,STAGES=2",
            "big+BM=128,STAGES=2",
            "big+BM=64,STAGES=3",
            "big+BM=128,STAGES=3",
            "baseline+EPI=0",
            "baseline+EPI=1",
            "big+EPI=0",
            "big+EPI=1",
        ]
    );
    // EPI=1 is the default: those points duplicate their base; so does
    // big+BM=128,STAGES=3 (the defaults).
    let dup = |id: &str| {
        pts.iter()
            .find(|p| p.id == id)
            .unwrap()
            .duplicate_of
            .clone()
    };
    assert_eq!(dup("baseline+EPI=1").as_deref(), Some("baseline"));
    assert_eq!(dup("big+EPI=1").as_deref(), Some("big"));
    assert_eq!(dup("big+BM=128,STAGES=3").as_deref(), Some("big"));
    assert_eq!(dup("big+EPI=0"), None);
    // Ids and hashes do not depend on axis order in the file.
    let swapped = SPEC.replace(
        "STAGES = [2, 3]\nBM = [64, 128]",
        "BM = [64, 128]\nSTAGES = [2, 3]",
    );
    let pts2 = spec::expand(&parse(&swapped).unwrap());
    for p in &pts {
        let q = pts2.iter().find(|q| q.id == p.id).expect("same ids");
        assert_eq!(q.hash, p.hash);
        assert_eq!(q.defines, p.defines);
    }
    assert_eq!(pts[0].hash.len(), 8);
    assert_eq!(
        pts[0].hash,
        spec::expand::define_hash("mmq", &pts[0].defines)
    );
}

const SHAPES: &str = r#"[tokens]
N = [1, 8, 512]

[shapes]
e4b.ffn_up = { m = "N", n = 10240, k = 2560, wtype = "Q8_0", from = "blk.*.ffn_up.weight, E4B" }
"12b.ffn_down" = { m = [3, 113], n = 3840, k = 15360, wtype = "Q4_0" }
tiny = { m = 2, n = 40, k = 96, wtype = "q8_0" }
"#;

#[test]
fn shapes_expand_with_names_and_sources() {
    let f = ShapesFile::parse("shapes/t.toml", SHAPES).unwrap();
    let s = f.expand();
    let names: Vec<&str> = s.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "e4b.ffn_up@m=1",
            "e4b.ffn_up@m=8",
            "e4b.ffn_up@m=512",
            "12b.ffn_down@m=3",
            "12b.ffn_down@m=113",
            "tiny@m=2"
        ]
    );
    assert_eq!((s[2].m, s[2].n, s[2].k), (512, 10240, 2560));
    assert_eq!(s[3].wtype_define(), "Q4_0");
    assert_eq!(s[0].from, "blk.*.ffn_up.weight, E4B");

    let e = ShapesFile::parse(
        "shapes/t.toml",
        &SHAPES.replace("wtype = \"Q4_0\"", "wtype = \"Q4_0\", dtype = 1"),
    )
    .unwrap_err();
    assert_eq!(e.line, 6, "{e}");
    assert!(e.msg.contains("unknown key `dtype`"), "{e}");
    let e =
        ShapesFile::parse("shapes/t.toml", &SHAPES.replace("m = \"N\"", "m = \"T\"")).unwrap_err();
    assert!(e.msg.contains("names no list in [tokens]"), "{e}");
}

#[test]
fn repo_specs_and_shapes_all_load() {
    let vdir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../variants");
    for f in gemtune_kernels::family::families() {
        let (s, _) = spec::load_family(&vdir, f.name()).unwrap_or_else(|e| panic!("{e}"));
        assert!(s.variants.iter().any(|v| v.name == "baseline"));
        for sh in &s.shapes {
            spec::load_shapes(&spec::shapes_path(&vdir, sh)).unwrap_or_else(|e| panic!("{e}"));
        }
    }
    for name in ["ffn", "attn_proj", "head", "decode.toml", "edge", "check"] {
        let f =
            spec::load_shapes(&spec::shapes_path(&vdir, name)).unwrap_or_else(|e| panic!("{e}"));
        assert!(!f.expand().is_empty());
    }
    let ffn = spec::load_shapes(&spec::shapes_path(&vdir, "ffn")).unwrap();
    let up = ffn
        .expand()
        .into_iter()
        .find(|s| s.name == "e4b.ffn_up@m=2048")
        .expect("e4b.ffn_up at 2048");
    assert_eq!((up.n, up.k), (10240, 2560));
}

#[test]
fn rejected_points_are_listed_with_the_reason() {
    let vdir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../variants");
    let (s, f) = spec::load_family(&vdir, "gemv").unwrap();
    let pts = spec::expand(&s);
    let shapes = ShapesFile::parse(
        "t.toml",
        "[shapes]\na = { m = [1, 9], n = 64, k = 64, wtype = \"Q8_0\" }\n",
    )
    .unwrap()
    .expand();
    let lim = gemtune_kernels::family::DeviceLimits::for_arch(gemtune_kernels::compile::Arch(90));
    let cells = spec::plan(f, &pts, &shapes, &lim);
    let live = pts.iter().filter(|p| p.duplicate_of.is_none()).count();
    assert_eq!(cells.len(), live * 2, "every (point, shape) is in the plan");
    // m = 9 is rejected for every gemv variant, for its token count; the
    // variants that do not read Q8_0 at all (the k-quant split form) are
    // rejected at both token counts, with that reason first.
    let too_many = "gemv handles 1..8 tokens, not m=9";
    let mut at9 = 0;
    for c in &cells {
        match (shapes[c.shape].m, &c.outcome) {
            (9, outcome) => {
                at9 += 1;
                let e = outcome.as_ref().expect_err("m = 9 runs nowhere");
                assert!(e == too_many || e.contains("k-quant planes"), "{e}");
            }
            (_, Err(e)) => {
                assert_ne!(e, too_many);
                assert!(e.contains("k-quant planes"), "{e}");
            }
            (_, Ok(_)) => {}
        }
    }
    assert_eq!(at9, live, "every live point is planned at m = 9");
    // Every variant that runs at m = 1 is refused at m = 9 for the count.
    let ok1 = cells
        .iter()
        .filter(|c| shapes[c.shape].m == 1 && c.outcome.is_ok())
        .count();
    let count9 = cells
        .iter()
        .filter(|c| shapes[c.shape].m == 9)
        .filter(|c| c.outcome.as_ref().err().is_some_and(|e| e == too_many))
        .count();
    assert!(ok1 > 0, "the Q8_0 variants run at m = 1");
    assert_eq!(count9, ok1);
}

#[test]
fn moe_shapes_parse_into_moe_problems() {
    use gemtune_kernels::family::{MoeProblem, Problem};
    use gemtune_kernels::quant::GgmlType;
    let text = r#"
[tokens]
N = [1, 8]

[shapes]
a4b.experts = { m = "N", experts = 128, used = 8, d_model = 2816, ffn = 704, wtype = "Q8_0", from = "26B-A4B" }
"#;
    let f = ShapesFile::parse("shapes/moe.toml", text).unwrap();
    let s = f.expand();
    assert_eq!(s.len(), 2);
    assert_eq!(s[1].name, "a4b.experts@m=8");
    assert_eq!(
        s[1].problem,
        Problem::Moe(MoeProblem {
            tokens: 8,
            d_model: 2816,
            ffn: 704,
            experts: 128,
            used: 8,
            wtype: GgmlType::Q8_0,
        })
    );
    assert_eq!((s[1].m, s[1].n, s[1].k), (8, 128, 2816));
    assert_eq!(s[1].wtype_define(), "Q8_0");
    assert_eq!(s[1].capped(4), {
        let Problem::Moe(mut p) = s[1].problem else {
            unreachable!()
        };
        p.tokens = 4;
        Some(Problem::Moe(p))
    });
    let e =
        ShapesFile::parse("shapes/moe.toml", &text.replace("used = 8", "used = 200")).unwrap_err();
    assert!(e.msg.contains("used = 200 exceeds experts = 128"), "{e}");
    let e = ShapesFile::parse("shapes/moe.toml", &text.replace("ffn = 704, ", "")).unwrap_err();
    assert!(e.msg.contains("ffn"), "{e}");
    let e = ShapesFile::parse("shapes/moe.toml", &text.replace("used", "usde")).unwrap_err();
    assert!(e.msg.contains("missing required key `used`"), "{e}");
}
