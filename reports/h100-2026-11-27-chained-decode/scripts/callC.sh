#!/usr/bin/env bash
# GPU call C (one H100): where the 26B-A4B decode moved. `ab` plain vs
# main (chaining alone) and the build before this session's changes
# (gemtune-prev) vs this one on 26B-A4B Q8_0; E4B Q8_0 `ab` of the GEMV
# prefetch (4 and 16 lines per row) against main; 31B Q4_0 `ab` plain vs
# main.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
ab() {
  local name=$1 base=$2 cand=$3 to=$4 reps=$5 m=$6 p=$7
  [ "$(gpu_left)" -lt "$to" ] && { echo "ab $name: skipped (time)"; return; }
  s=$SECONDS; timeout "$to" gemtune ab --reps "$reps" --quiet --out "$R/ab-$name" --baseline "$base" --candidate "$cand" -m "$m" -p "$p" -n 128 > "$R/ab-$name.txt" 2> "$R/ab-$name.log"
  echo "== ab $name: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$name.txt"; rm -f "$R"/ab-$name/worker-*.log "$R"/ab-$name/*.png
  pack
}
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
ab 26b-q8-chained $P/plain.toml main 90 10 $m 512
ab 26b-q8-prev-vs-this $PWD/.gpu/bin/gemtune-prev $PWD/.gpu/bin/gemtune 90 10 $m 512
rm -f $m
m=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $m > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
ab e4b-q8-prefetch4 main $P/prefetch4.toml 70 12 $m 512
ab e4b-q8-prefetch16 main $P/prefetch16.toml 70 12 $m 512
rm -f $m
m=/tmp/31b-q4_0.gguf
if [ "$(gpu_left)" -gt 150 ]; then
  s=$SECONDS; gemtune synth 31b q4_0 $m > /dev/null && sync; echo "synth 31b q4_0 $((SECONDS - s)) s"
  ab 31b-q4-chained $P/plain.toml main 130 8 $m 512
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
