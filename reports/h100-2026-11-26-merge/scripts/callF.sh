#!/usr/bin/env bash
# GPU call F: cuda_parity after the head-upload fix (the head copy read as
# the planned type).
set -u
cd "$(dirname "$0")/.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
mkdir -p "$OUT/r"
timeout 125 .gpu/tests/cuda_parity-* --include-ignored --test-threads=1 > "$OUT/r/cuda_parity.log" 2>&1; echo "cuda_parity rc=$?"
grep -E "^test |test result|panicked at" "$OUT/r/cuda_parity.log"
