#!/usr/bin/env bash
# GPU call E (one H100): the kernel-level MoE GPU tests (`gpu_moe`), whose
# `moe_gemv_variants_pass` now also checks the dp4a forms (ALGO 1 and 2)
# on every type and shape it covers, and whose bytes-read test also runs
# ALGO 2. Call D reached three of its tests before its time ran out.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 300
pack() { tar -C "$OUT" -czf "$OUT/callE.tgz" r; }
gpu_test gpu_moe 290
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
