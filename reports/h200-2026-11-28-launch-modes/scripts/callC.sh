#!/usr/bin/env bash
# GPU call C (one H200, about 9 minutes): main with its Q4_0 and Q4_K expert
# gate|up at HOIST=1, MINB=2 against main before (scripts/main-before.toml)
# on 26B-A4B Q4_K_M and Q4_0; the two HOIST variants against the oracle on
# every moe shape; the MoE and dense parity suites on this tree; 26B-A4B
# Q4_K_M bench. Stage as for call A with .gpu/tests/cuda_moe-* and
# .gpu/tests/cuda_parity-* in the tarball, then `run` with carry
# [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-launch-modes/scripts/callC.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
B=reports/h200-2026-11-28-launch-modes/scripts/main-before.toml
gpu_check moe_gemv 90 --variant gate-up-split-records-hoist-minb2 --variant gate-up-split-records-hoist
pack
for ft in q4_k_m q4_0; do
  m=/tmp/26b-$ft.gguf
  s=$SECONDS; gemtune synth 26b-a4b $ft $m > /dev/null && sync; echo "synth 26b $ft $((SECONDS - s)) s"
  gpu_ab 26b-$ft "$B" main 90 8 $m 512
  if [ $ft = q4_k_m ] && [ "$(gpu_left)" -ge 230 ]; then
    s=$SECONDS
    timeout 60 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-$ft.txt" 2> "$R/bench-26b-$ft.log"
    echo "bench 26b $ft rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-$ft.txt"
  fi
  rm -f $m
  pack
done
gpu_test cuda_moe 60
pack
gpu_test cuda_parity 160
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
