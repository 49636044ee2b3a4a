#!/usr/bin/env bash
# The compile gate under the newest NVRTC 13.x on PyPI, beside the pinned
# 13.0.88 that the test suite and the compile report use. A newer compiler
# allocates registers differently, and a kernel sitting at its register
# ceiling can start spilling; a newer front end can refuse a construct. This
# catches both before users with a newer toolkit do.
#   scripts/nvrtc-newest-gate.sh
#
# What it compiles, on sm_90 (the arch the repository tunes and ships
# tables for): every named variant of every family (each code path: every
# arithmetic form, layout and stage), and of the sweep points those within
# 32 registers of the 255 ceiling under the pinned compiler (their rows in
# reports/baseline/compile.csv), which are the points a different
# allocator can push over it; a sweep point far below the ceiling runs the
# code of its named variant with other tile counts, and the compile report
# has compiled it under the pinned compiler. Families whose kernels ask
# __launch_bounds__ for several blocks per SM (OCC_BLOCKS in their source)
# have a ceiling below 255 that the baseline does not record, so every
# point of theirs is compiled. sm_80 and sm_89 are compiled by the pinned
# compiler only (every named variant, in the compile report): the newer
# compiler's passes over them did not fit CI's 90 minutes on two cores
# (reports/ci-time-2026-12-07.md).
# NVRTC_NEWEST_ARCHS="sm_80 sm_89 sm_90" adds them (their named variants).
# Its cubins are cached in target/gemtune/nvrtc-newest-cubin (the newest
# compiler's own cache, inside the checkout) and pip keeps no download cache.
# Environment: GEMTUNE (binary; default: cargo's debug build, found by
# scripts/gemtune-bin.sh, so CARGO_TARGET_DIR is honoured), NVRTC_NEWEST_DIR
# (default target/nvrtc-newest), NVRTC_NEWEST_SPEC (default
# "nvidia-cuda-nvrtc>=13,<14"), NVRTC_NEWEST_ARCHS (default sm_90),
# NVRTC_NEWEST_ALL=1 (every point of every family on each of those archs).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${NVRTC_NEWEST_DIR:-target/nvrtc-newest}
spec=${NVRTC_NEWEST_SPEC:-nvidia-cuda-nvrtc>=13,<14}
baseline=reports/baseline/compile.csv
rm -rf "$dir"
python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dir" "$spec" >&2
lib=$(ls -d "$PWD/$dir"/nvidia/cu13/lib)
version=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from importlib.metadata import version; print(version("nvidia-cuda-nvrtc"))' "$dir" 2>/dev/null || echo '?')
bin=$(scripts/gemtune-bin.sh)
export GEMTUNE_CACHE_DIR=$PWD/target/gemtune/nvrtc-newest-cubin
out=target/gemtune/nvrtc-newest
rm -rf "$out"
mkdir -p "$out"

# Families compiled whole on sm_90: those whose sources size __launch_bounds__ by
# OCC_BLOCKS (one family per kernels/cuda/<family>.cu).
capped=$(grep -l 'OCC_BLOCKS(' kernels/cuda/*.cu | xargs -n1 basename | sed 's/\.cu$//' | paste -sd, -)

# The rest: for one arch, the baseline's families (other than those
# compiled whole) and the variant ids to compile, one per line after the
# first.
select_rows() { # arch families-compiled-whole
    python3 - "$baseline" "$1" "$2" <<'EOF'
import csv, sys, tomllib
path, arch, capped = sys.argv[1], sys.argv[2], set(filter(None, sys.argv[3].split(",")))
families, ids = set(), set()
for r in csv.DictReader(open(path)):
    if r["arch"] != arch or r["family"] in capped:
        continue
    families.add(r["family"])
    registers = int(r["registers"]) if r["registers"] else 0
    if "+" not in r["variant"] or registers >= 224:
        ids.add(r["variant"])
# Named variants from the specs too, so one not yet in the baseline is compiled.
for family in families:
    with open(f"variants/{family}.toml", "rb") as f:
        ids.update(v["name"] for v in tomllib.load(f).get("variant", []))
print(",".join(sorted(families)))
for i in sorted(ids):
    print(i)
EOF
}

status=0
run_check() { # arch tag check-args...
    local arch=$1 tag=$2
    shift 2
    local rc=0
    LD_LIBRARY_PATH="$lib" "$bin" check --compile-only --arch "$arch" --out "$out/$arch-$tag" "$@" \
        >"$out/$arch-$tag.txt" 2>"$out/$arch-$tag.log" || rc=$?
    echo "nvrtc $version, $arch, $tag: exit $rc"
    if [[ $rc != 0 ]]; then
        grep -E ' (spills|compile-error) ' "$out/$arch-$tag.txt" >&2 || tail -5 "$out/$arch-$tag.log" >&2
        status=$rc
    fi
}

for arch in ${NVRTC_NEWEST_ARCHS:-sm_90}; do
    if [[ ${NVRTC_NEWEST_ALL:-0} == 1 ]]; then
        run_check "$arch" all
        continue
    fi
    whole=""
    [[ $arch == sm_90 ]] && whole=$capped
    [[ -n $whole ]] && run_check "$arch" "whole" "$whole"
    mapfile -t sel < <(select_rows "$arch" "$whole")
    args=()
    for id in "${sel[@]:1}"; do
        args+=(--variant "$id")
    done
    if [[ -z ${sel[0]:-} ]]; then
        echo "nvrtc-newest-gate: $baseline has no $arch rows" >&2
        exit 4
    fi
    echo "$arch: $((${#sel[@]} - 1)) variant ids of ${sel[0]}${whole:+; every point of $whole}"
    run_check "$arch" "named-and-ceiling" "${sel[0]}" "${args[@]}"
done
exit "$status"
