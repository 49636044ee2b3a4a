#!/usr/bin/env bash
# GPU call B (one H200, about 9 minutes): the Q4_0 expert gate|up at the new
# MINB / HOIST points, main's expert variants checked again after the
# kernel's refactor, the prefill GEMM of the k-quant and 16-bit types at the
# three shapes that missed 10 % of the Q8_0 path, and 26B-A4B Q4_K_M decode
# with the faster expert gate|up (profile scripts/moe-minb.toml) against
# main. Stage as for call A with .gpu/tests/cuda_moe-* in the tarball, then
# `run` with carry [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-launch-modes/scripts/callB.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
T="--budget-ms 30 --min-reps 20 --max-reps 100 --regime dram --no-reference"
tune() {
  local name=$1 to=$2 fam=$3; shift 3
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune "$fam" $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png
  pack
}
# 1. main's expert points and the candidate's, against the oracle again
#    (the kernel's prologue was refactored), 1, 3 and 8 tokens.
gpu_check moe_gemv 60 --variant gate-up-split-records --variant down-records \
  --variant 'gate-up-split-records-hoist*' --variant down-records-rows2-minb4 --tokens 1,3,8
pack
# 2. Q4_0 and Q8_0 stacks: the new points at one token, stream and chained.
for mode in stream chained; do
  tune "moe-$mode" 45 moe_gemv --tokens 1 --launches $mode --shape moe_gemv.a4b_q4 --shape moe_gemv.a4b_q8 \
    --variant gate-up-split-records --variant 'gate-up-split-records-hoist*' --variant down-records \
    --variant down-records-rows2-minb4
done
# 3. End to end: 26B-A4B Q4_K_M decode, main -> MINB=2 / HOIST=1 gate|up.
m=/tmp/26b-q4_k_m.gguf
s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
gpu_ab 26b-q4km main reports/h200-2026-11-28-launch-modes/scripts/moe-minb.toml 150 8 $m 512
rm -f $m
pack
# 4. The MoE parity suite (main and strict on tiny-moe, graph and chained
#    decode bit-identical) on this kernel.
gpu_test cuda_moe 130
pack
# 5. Prefill GEMM at 2048 tokens: every wide / tall point at the three
#    k-quant and 16-bit shapes that missed 10 % of Q8_0, and the Q8_0 shapes.
tune gemm 150 gemm_wgmma --tokens 2048 --check-max-m 64 --shapes ffn_ktypes \
  --shape e4b_q5k.ffn_up --shape e4b.ffn_up --shape 31b_q4k.ffn_up --shape 31b_bf16.ffn_up --shape 31b.ffn_up \
  --variant wide --variant 'wide+*' --variant tall --variant split-k
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
