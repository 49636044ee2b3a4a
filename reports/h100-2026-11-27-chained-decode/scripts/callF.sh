#!/usr/bin/env bash
# GPU call F (one H100): the final tree. The engine's GPU parity suites
# (cuda_parity, cuda_moe, cuda_phases: every kernel now starts with the
# wait of a chained launch, main chains dense decode steps); `gemtune
# check` of the row-wise and router families and main's GEMV points (every
# kernel source changed); bench of main on E4B Q8_0, 31B Q4_0 and 26B-A4B
# Q8_0.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callF.tgz" r; }
gpu_test cuda_parity 150
gpu_test cuda_moe 80
gpu_test cuda_phases 30
pack
gpu_check rmsnorm,gelu_mul,qk_norm_rope,embed,ple,softcap,quantize_q8_1,moe_route,act_convert,scale_expand 70
gpu_check gemv 40 --variant planes-fma --variant h100-dp4a --variant fused-gate-up --variant split-records
pack
bench() {
  local v=$1 w=$2 to=$3
  [ "$(gpu_left)" -lt "$to" ] && { echo "bench $v $w: skipped (time)"; return; }
  local m=/tmp/$v-$w.gguf s=$SECONDS
  gemtune synth $v $w $m > /dev/null && sync
  timeout "$to" gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-$v-$w.txt" 2> "$R/bench-$v-$w.log"
  echo "bench $v $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-$v-$w.txt"
  rm -f $m; pack
}
bench e4b q8_0 40
bench 31b q4_0 70
bench 26b-a4b q8_0 60
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
