#!/usr/bin/env bash
# GPU call E (one H100): call D's fused gate|up again, its grid now sized
# to the outputs it computes (n / 2 rows: call D's launches covered the
# whole gate|up matrix, half the blocks finding no rows). `ab` of
# q8-unfused against main on E4B Q8_0, bench and phases, then 26B-A4B as
# time allows. Stage: the release gemtune alone in .gpubase/stage.tar.xz.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 270
pack() { tar -C "$OUT" -czf "$OUT/callE.tgz" r; }
S=reports/h100-2026-11-28-q8-records/scripts
gemtune synth e4b q8_0 /tmp/e4b.gguf > /dev/null && sync
s=$SECONDS; timeout 90 gemtune ab --reps 16 --quiet --out "$R/ab-e4b-fused" --baseline $S/q8-unfused.toml --candidate main -m /tmp/e4b.gguf -p 512 -n 128 > "$R/ab-e4b-fused.txt" 2> "$R/ab-e4b-fused.log"
echo "== ab e4b q8_0 q8-unfused vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-fused.txt"; rm -f "$R"/ab-e4b-fused/worker-*.log "$R"/ab-e4b-fused/*.png
pack
timeout 30 gemtune run -v -m /tmp/e4b.gguf -p "hello" -n 2 > "$R/run-v-e4b-q8.txt" 2>&1
grep -E "^gemv.gate_up|^gelu" "$R/run-v-e4b-q8.txt" | head -4
s=$SECONDS; timeout 40 gemtune bench -m /tmp/e4b.gguf -p 512 -n 128 -r 3 > "$R/bench-e4b-q8.txt" 2> "$R/bench-e4b-q8.log"
echo "bench e4b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-q8.txt" | head -6
s=$SECONDS; timeout 30 gemtune bench -m /tmp/e4b.gguf -p 0 -n 64 -r 1 --profile-phases > "$R/phases-e4b-q8-main.txt" 2>&1; echo "phases e4b rc=$? $((SECONDS - s)) s"
rm -f /tmp/e4b.gguf
pack
if [ "$(gpu_left)" -gt 100 ]; then
  s=$SECONDS; gemtune synth 26b-a4b q8_0 /tmp/26b.gguf > /dev/null && sync; echo "synth 26b $((SECONDS - s)) s"
  s=$SECONDS; timeout $(( $(gpu_left) - 5 )) gemtune ab --reps 8 --quiet --out "$R/ab-26b-fused" --baseline $S/q8-unfused.toml --candidate main -m /tmp/26b.gguf -p 512 -n 128 > "$R/ab-26b-fused.txt" 2> "$R/ab-26b-fused.log"
  echo "== ab 26b-a4b q8_0 q8-unfused vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-26b-fused.txt"; rm -f "$R"/ab-26b-fused/worker-*.log "$R"/ab-26b-fused/*.png
  rm -f /tmp/26b.gguf
fi
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
