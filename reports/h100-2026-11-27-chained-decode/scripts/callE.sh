#!/usr/bin/env bash
# GPU call E (one H100): chaining without the MoE block (decode_launch =
# "chained-dense"). The chained-decode parity tests (dense E2B-shaped and
# tiny-moe: plain, chained and chained-dense bit for bit); 26B-A4B Q8_0
# `ab` plain vs chained-dense and bench under chained-dense; E4B Q8_0 `ab`
# plain vs chained-dense.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callE.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
gpu_test cuda_parity 90 chained_decode graph_decode
gpu_test cuda_moe 60 chained_decode graph_decode
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
ab 26b-q8-chained-dense $P/plain.toml $P/chained-dense.toml 90 10 $m 512
s=$SECONDS; timeout 50 gemtune bench -m $m --profile $P/chained-dense.toml -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0-chained-dense.txt" 2> "$R/bench-26b-q8_0-chained-dense.log"
echo "bench 26b chained-dense rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0-chained-dense.txt"
pack
rm -f $m
m=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $m > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
ab e4b-q8-chained-dense $P/plain.toml $P/chained-dense.toml 70 12 $m 512
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
