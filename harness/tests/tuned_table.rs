//! The committed tuned tables stay usable: every entry names a known
//! family, and its defines are accepted by that family for its own shape on
//! the table's architecture (so a kernel or spec change that would make the
//! engine pick an impossible variant fails here, on the CPU).

mod common;

use gemtune::tuned::{read, TunedDefine};
use gemtune_kernels::compile::Arch;
use gemtune_kernels::defines::{DefineValue, Defines};
use gemtune_kernels::family::{family, DeviceLimits, Problem};
use gemtune_kernels::quant::GgmlType;

#[test]
fn committed_tables_validate_against_their_families() {
    let dir = common::repo_root().join("variants/tuned");
    let mut tables = 0;
    for e in std::fs::read_dir(&dir).expect("variants/tuned") {
        let path = e.expect("dir entry").path();
        if path.extension().and_then(|x| x.to_str()) != Some("toml") {
            continue;
        }
        tables += 1;
        let t = read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let arch: Arch = t.arch.parse().expect("arch");
        assert!(!t.entries.is_empty(), "{}: no entries", path.display());
        for en in &t.entries {
            let what = format!("{} {} {}", path.display(), en.family, en.shape);
            let f = family(&en.family).unwrap_or_else(|| panic!("{what}: unknown family"));
            let d: Defines = en
                .defines
                .iter()
                .map(|(k, v)| {
                    let v = match v {
                        TunedDefine::Int(i) => DefineValue::Int(*i),
                        TunedDefine::Str(s) => DefineValue::Str(s.clone()),
                    };
                    (k.clone(), v)
                })
                .collect();
            let wt = GgmlType::from_name(&en.wtype.to_ascii_lowercase())
                .unwrap_or_else(|| panic!("{what}: weight type {}", en.wtype));
            let p = Problem::matmul(en.m, en.n, en.k, wt);
            f.validate(&d, &p, &DeviceLimits::for_arch(arch))
                .unwrap_or_else(|r| panic!("{what}: rejected: {r}"));
            assert!(
                en.tie_band.contains(&en.variant),
                "{what}: winner outside its tie band"
            );
            assert!(en.best_median_us > 0.0, "{what}");
        }
    }
    assert!(tables > 0, "no tuned table under {}", dir.display());
}
