#!/usr/bin/env bash
# GPU call C (one H100): main (Q8_0 decode on split records) against the
# same with the gate|up GEMV unsplit over k (scripts/q8-gu1.toml) on E4B
# Q8_0; decode phase tables of E4B Q8_0 and 31B Q4_0 (issue 22's per-step
# accounting) and q8-fma's E4B table beside them; 31B Q4_0 bench. Same
# stage as call B (.gpubase/stage.tar.xz).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
P=reports/h100-2026-11-28-q8-records/scripts/q8-gu1.toml
gemtune synth e4b q8_0 /tmp/e4b.gguf > /dev/null && sync
s=$SECONDS; timeout 100 gemtune ab --reps 16 --quiet --out "$R/ab-e4b-gu1" --baseline main --candidate $P -m /tmp/e4b.gguf -p 512 -n 128 > "$R/ab-e4b-gu1.txt" 2> "$R/ab-e4b-gu1.log"
echo "== ab e4b q8_0 main vs q8-gu1: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-gu1.txt"; rm -f "$R"/ab-e4b-gu1/worker-*.log "$R"/ab-e4b-gu1/*.png
pack
for p in main q8-fma; do
  s=$SECONDS; timeout 40 gemtune bench -m /tmp/e4b.gguf -p 0 -n 64 -r 1 --profile $p --profile-phases > "$R/phases-e4b-q8-$p.txt" 2>&1; echo "phases e4b $p rc=$? $((SECONDS - s)) s"
done
s=$SECONDS; timeout 60 gemtune bench -m /tmp/e4b.gguf -p 0 -n 128 -d 32768 -r 2 > "$R/bench-e4b-q8-d32768.txt" 2> "$R/bench-e4b-q8-d32768.log"
echo "bench e4b d32768 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-q8-d32768.txt"
rm -f /tmp/e4b.gguf
pack
s=$SECONDS; gemtune synth 31b q4_0 /tmp/31b.gguf > /dev/null && sync; echo "synth 31b $((SECONDS - s)) s"
s=$SECONDS; timeout 90 gemtune bench -m /tmp/31b.gguf -p 512 -n 128 -r 3 > "$R/bench-31b-q4_0.txt" 2> "$R/bench-31b-q4_0.log"
echo "bench 31b q4_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-31b-q4_0.txt"
s=$SECONDS; timeout 60 gemtune bench -m /tmp/31b.gguf -p 0 -n 32 -r 1 --profile-phases > "$R/phases-31b-q4_0.txt" 2>&1; echo "phases 31b rc=$? $((SECONDS - s)) s"
rm -f /tmp/31b.gguf
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
