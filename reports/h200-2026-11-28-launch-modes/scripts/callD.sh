#!/usr/bin/env bash
# GPU call D (one H200, about 6 minutes): every moe_gemv variant of the
# spec against the oracle (the staged gpu_moe suite: each variant's sweep
# compiled at once, then checked), and `check moe_gemv` of the four HOIST
# variants no earlier call checked on every moe shape. Stage as for call A
# with .gpu/tests/gpu_moe-* in the tarball, then `run` with carry
# [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-launch-modes/scripts/callD.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 520
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
gpu_check moe_gemv 120 --variant gate-up-split-hoist --variant gate-up-dp4a-hoist \
  --variant down-split-hoist --variant down-dp4a-hoist --variant down-records-rows2-minb4
pack
gpu_test gpu_moe 330
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
