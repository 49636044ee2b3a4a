#!/usr/bin/env bash
# GPU call B (one H100): the prefetch variants against the oracle (gemv
# PREFETCH, moe_gemv down PREFETCH), the MoE engine tests (tiny-moe parity
# and graph decode, chained), the MoE kernel tests; E4B Q8_0 `ab` plain vs
# main with more reps; 26B-A4B Q8_0 bench of the build before and this one,
# `ab` main vs moe-down-prefetch; E4B fused-gelu vs main (chained).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
gpu_check gemv 45 --variant planes-fma-prefetch --variant dp4a-prefetch
gpu_check moe_gemv 30 --variant down-prefetch
pack
gpu_test cuda_moe 80
gpu_test gpu_moe 60 moe_gemv
pack
ab() {
  local name=$1 base=$2 cand=$3 to=$4 reps=$5 m=$6 p=$7
  [ "$(gpu_left)" -lt "$to" ] && { echo "ab $name: skipped (time)"; return; }
  s=$SECONDS; timeout "$to" gemtune ab --reps "$reps" --quiet --out "$R/ab-$name" --baseline "$base" --candidate "$cand" -m "$m" -p "$p" -n 128 > "$R/ab-$name.txt" 2> "$R/ab-$name.log"
  echo "== ab $name: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$name.txt"; rm -f "$R"/ab-$name/worker-*.log "$R"/ab-$name/*.png
  pack
}
m=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $m > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
ab e4b-q8-chained $P/plain.toml main 110 16 $m 512
rm -f $m
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
for b in gemtune-prev gemtune; do
  s=$SECONDS; timeout 60 $b bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0-$b.txt" 2> "$R/bench-26b-q8_0-$b.log"
  echo "bench 26b $b rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0-$b.txt"
done
pack
ab 26b-q8-moe-down-prefetch main $P/moe-down-prefetch.toml 100 10 $m 512
rm -f $m
m=/tmp/e4b-q8_0.gguf
if [ "$(gpu_left)" -gt 90 ]; then
  gemtune synth e4b q8_0 $m > /dev/null && sync
  ab e4b-q8-fused-gelu main $P/fused-gelu.toml 80 10 $m 512
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
