#!/usr/bin/env bash
# The compile gate under the newest NVRTC 13.x on PyPI, beside the pinned
# 13.0.88 that the test suite uses: every variant of every family compiles
# for sm_80, sm_89 and sm_90 without a spill where its spec forbids spills.
# A newer compiler allocates registers differently, and a kernel sitting at
# the 255-register ceiling can start spilling; this catches it before users
# with a newer toolkit do.
#   scripts/nvrtc-newest-gate.sh
# Its cubins are cached in target/gemtune/nvrtc-newest-cubin (the newest
# compiler's own cache, inside the checkout) and pip keeps no download cache.
# Environment: GEMTUNE (binary; default: cargo's debug build, found by
# scripts/gemtune-bin.sh, so CARGO_TARGET_DIR is honoured), NVRTC_NEWEST_DIR
# (default target/nvrtc-newest), NVRTC_NEWEST_SPEC (default
# "nvidia-cuda-nvrtc>=13,<14").
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${NVRTC_NEWEST_DIR:-target/nvrtc-newest}
spec=${NVRTC_NEWEST_SPEC:-nvidia-cuda-nvrtc>=13,<14}
rm -rf "$dir"
python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --target "$dir" "$spec" >&2
lib=$(ls -d "$PWD/$dir"/nvidia/cu13/lib)
version=$(python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from importlib.metadata import version; print(version("nvidia-cuda-nvrtc"))' "$dir" 2>/dev/null || echo '?')
bin=$(scripts/gemtune-bin.sh)
export GEMTUNE_CACHE_DIR=$PWD/target/gemtune/nvrtc-newest-cubin
out=target/gemtune/nvrtc-newest
rm -rf "$out"
mkdir -p "$out"
status=0
for arch in sm_80 sm_89 sm_90; do
    rc=0
    LD_LIBRARY_PATH="$lib" "$bin" check --compile-only --arch "$arch" --out "$out/$arch" \
        >"$out/$arch.txt" 2>"$out/$arch.log" || rc=$?
    echo "nvrtc $version, $arch: exit $rc"
    if [[ $rc != 0 ]]; then
        grep -E ' (spills|compile-error) ' "$out/$arch.txt" >&2 || tail -5 "$out/$arch.log" >&2
        status=$rc
    fi
done
exit "$status"
