#!/usr/bin/env bash
# GPU call G (one H100): the MoE down GEMV split over warps (moe_gemv
# KSPLIT). `check moe_gemv` of the split variants (tiny shapes with fewer
# chunks than lanes, the byte count with KSPLIT), `tune moe_gemv` of every
# DOWN variant at 26B-A4B Q8_0 (1 token, DRAM), then `ab` main vs
# moe-down-ksplit2 and moe-down-ksplit4 on 26B-A4B Q8_0.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callG.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
gpu_check moe_gemv 60 --variants-dir .gpubase/variants --variant 'down-ksplit*' --variant down-rows2 --variant down-count
pack
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
s=$SECONDS; timeout 150 gemtune tune moe_gemv --variants-dir .gpubase/variants --shape moe_gemv.a4b_q8 --tokens 1 --variant 'down*' $T --out "$R/tune-moe_gemv-down" > "$R/tune-moe_gemv-down.txt" 2>&1
echo "tune moe_gemv down rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv-down/*.png; grep -A12 -i "best" "$R/tune-moe_gemv-down/summary.md" | head -30
pack
ab() {
  local name=$1 base=$2 cand=$3 to=$4 reps=$5 m=$6 p=$7
  [ "$(gpu_left)" -lt "$to" ] && { echo "ab $name: skipped (time)"; return; }
  s=$SECONDS; timeout "$to" gemtune ab --reps "$reps" --quiet --out "$R/ab-$name" --baseline "$base" --candidate "$cand" -m "$m" -p "$p" -n 128 > "$R/ab-$name.txt" 2> "$R/ab-$name.log"
  echo "== ab $name: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$name.txt"; rm -f "$R"/ab-$name/worker-*.log "$R"/ab-$name/*.png
  pack
}
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
ab 26b-q8-down-ksplit4 main $P/moe-down-ksplit4.toml 80 10 $m 512
ab 26b-q8-down-ksplit2 main $P/moe-down-ksplit2.toml 80 10 $m 512
if [ "$(gpu_left)" -gt 50 ]; then
  s=$SECONDS; timeout 45 gemtune bench -m $m --profile $P/moe-down-ksplit4.toml -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0-ksplit4.txt" 2> "$R/bench-26b-q8_0-ksplit4.log"
  echo "bench 26b ksplit4 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0-ksplit4.txt"
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
