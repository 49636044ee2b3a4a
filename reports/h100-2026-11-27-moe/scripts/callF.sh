#!/usr/bin/env bash
# GPU call F (one H100): after moe_route's output pointers moved past the
# dot products (the NVRTC 13.5 spill fix), its oracle checks on every
# router type and token count of the check shapes, and the engine's MoE
# parity tests (strict, main, the grouped GEMMs, graph vs eager), whose
# prefill routes chunks in grid.y groups. Pack gemtune and the cuda_moe
# test executable into .gpubase/stage.tar.xz, `run` with carry
# [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 200
pack() { tar -C "$OUT" -czf "$OUT/callF.tgz" r; }
gpu_check moe_route 60
pack
gpu_test cuda_moe 100
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
