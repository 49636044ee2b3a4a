#!/usr/bin/env bash
# GPU call D (one H100): main's final expert GEMV points (the call-C tune
# winners: Q4_K gate|up one row pair x 8 warps, DOWN 4 rows x 4-warp groups;
# the kernels are call C's). The MoE parity suite, `ab` of the previous
# expert GEMVs (`moe-fma`) against main on 26B-A4B Q8_0 and Q4_K_M (10
# reps), bench of both, then the kernel-level MoE GPU tests (`gpu_moe`) and
# the dense engine's parity suite (`cuda_parity`) as time allows.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
gpu_test cuda_moe 100
pack
bench() {
  local w=$1 m=$2 to=$3
  [ "$(gpu_left)" -lt "$to" ] && { echo "bench $w: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-$w.txt" 2> "$R/bench-26b-$w.log"
  echo "bench 26b $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-$w.txt"
  pack
}
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-q8 variants/profiles/moe-fma.toml main 90 10 $m 512
pack
bench q8_0 $m 50
rm -f $m
m=/tmp/26b-q4km.gguf
s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
gpu_ab 26b-q4km variants/profiles/moe-fma.toml main 80 10 $m 512
pack
bench q4_k_m $m 45
rm -f $m
gpu_test gpu_moe 150
pack
gpu_test cuda_parity 150
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
