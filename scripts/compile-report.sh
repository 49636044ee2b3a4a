#!/usr/bin/env bash
# The compile report: registers, spill bytes and shared memory of the kernel
# variants (NVRTC only, no GPU), one row per family x variant x arch (the
# worst over its shapes), compared with the committed baseline
# reports/baseline/compile.csv through `gemtune report`:
#   sm_90: every variant, the sweep points included (the tuned tables the
#          repository ships are sm_90's, so every point a tune may pick);
#   sm_80, sm_89: every named variant of every family, i.e. every code path
#          (arithmetic form, layout, stage). A sweep point runs its named
#          variant's code with other tile counts; a tune on those archs
#          compiles its points and reports their spills itself. The
#          sweeps on all three archs did not fit CI's 90 minutes on two
#          cores (reports/ci-time-2026-12-07.md).
#
#   scripts/compile-report.sh            compare (CI): exit 1 when a variant
#                                        gained a spill, grew its registers or
#                                        shared memory beyond the band, stopped
#                                        compiling or vanished; summary.md names it
#   scripts/compile-report.sh --update   rewrite reports/baseline/compile.csv
#                                        from this checkout (commit the result)
#
# The NVRTC compiles use the test suite's cubin cache (target/gemtune/test-cubin,
# unless GEMTUNE_CACHE_DIR is set), which the compile gate filled, so after
# `cargo test` this takes seconds. The baseline must come from the pinned
# NVRTC (13.0.88, which scripts/nvrtc-env.sh installs).
# Environment: GEMTUNE (binary; default: cargo's debug build, found by
# scripts/gemtune-bin.sh, so CARGO_TARGET_DIR is honoured), OUT (default
# target/gemtune/compile-report).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/nvrtc-env.sh
export GEMTUNE_CACHE_DIR=${GEMTUNE_CACHE_DIR:-$PWD/target/gemtune/test-cubin}

mode=compare
case ${1:-} in
"") ;;
--update) mode=update ;;
*)
    echo "usage: scripts/compile-report.sh [--update]" >&2
    exit 4
    ;;
esac

bin=$(scripts/gemtune-bin.sh)
out=${OUT:-target/gemtune/compile-report}
baseline=reports/baseline/compile.csv
rm -rf "$out"
mkdir -p "$out"
current=$out/compile.csv

# The named variants of every family's spec, as check arguments.
named=()
while read -r id; do
    named+=(--variant "$id")
done < <(python3 - <<'EOF'
import glob, tomllib
for path in sorted(glob.glob("variants/*.toml")):
    with open(path, "rb") as f:
        for v in tomllib.load(f).get("variant", []):
            print(v["name"])
EOF
)
if [[ ${#named[@]} == 0 ]]; then
    echo "compile-report: no named variants found in variants/*.toml" >&2
    exit 4
fi

status=0
for arch in sm_80 sm_89 sm_90; do
    select=()
    [[ $arch == sm_90 ]] || select=("${named[@]}")
    # check exits 4 on a compile error and 3 on a forbidden spill; its rows
    # (verdict compile-error / spills) still go into the report.
    rc=0
    "$bin" check --compile-only --arch "$arch" --out "$out/check-$arch" ${select[@]+"${select[@]}"} \
        --compile-report "$current" >"$out/check-$arch.txt" 2>"$out/check-$arch.log" || rc=$?
    if [[ $rc != 0 ]]; then
        echo "compile-report: check --arch $arch exited $rc (see $out/check-$arch.log)" >&2
        status=$rc
    fi
done

if [[ $mode == update ]]; then
    if [[ $status != 0 ]]; then
        echo "compile-report: not updating $baseline: a check failed" >&2
        exit "$status"
    fi
    cp "$current" "$baseline"
    echo "wrote $baseline ($(($(wc -l <"$baseline") - 1)) rows, $("$bin" --version)); commit it"
    exit 0
fi

"$bin" report --baseline "$baseline" --current "$current" --out "$out/report" || status=$?
echo "compile report: $out/report/summary.md" >&2
exit "$status"
