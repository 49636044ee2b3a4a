#!/usr/bin/env bash
# GPU call D: the ab A/A of this build against the session's starting build
# (6026068) on E4B Q8_0, bench of E4B in q4_k_m, q4_0 and bf16 (device
# memory, pp512, tg128 with floor %), then the 12B Q4_0 A/A.
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
mkdir -p /tmp/base && cp gemtune-base /tmp/base/gemtune
export PATH="$PWD/.gpu/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((585 - (SECONDS - t0))); }
ab() { # name model
  local l=$(left); [ "$l" -lt 60 ] && { echo "$1: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$l" gemtune ab --reps 10 --quiet --out "$R/$1" --baseline /tmp/base/gemtune --candidate "$PWD/.gpu/bin/gemtune" -m "$2" -p 2048 -n 128 > "$R/$1.txt" 2>"$R/$1.log"; local rc=$?
  echo "== $1: exit $rc in $((SECONDS-s)) s"; cat "$R/$1.txt"; [ $rc -lt 3 ] || tail -5 "$R/$1.log"
  rm -rf "$R/$1"/worker-*.log 2>/dev/null
}
gemtune synth e4b q8_0 /tmp/e4b-q8_0.gguf > /dev/null && sync
ab e4b-q8_0-aa /tmp/e4b-q8_0.gguf
rm -f /tmp/e4b-q8_0.gguf
for w in q4_k_m q4_0 bf16; do
  l=$(left); [ "$l" -lt 60 ] && { echo "bench $w skipped (time)"; continue; }
  s=$SECONDS; gemtune synth e4b $w /tmp/e4b-$w.gguf > /dev/null 2>&1; sync; echo "synth e4b $w $((SECONDS-s)) s, $(stat -c %s /tmp/e4b-$w.gguf) bytes"
  timeout 60 gemtune run -v -m /tmp/e4b-$w.gguf -p Hello -n 4 > "$R/run-v-e4b-$w.txt" 2>&1; grep -iE "weights|convert" "$R/run-v-e4b-$w.txt" | head -3
  timeout $(( l < 120 ? l : 120 )) gemtune bench -m /tmp/e4b-$w.gguf -p 512 -n 128 -r 3 > "$R/bench-e4b-$w.txt" 2>&1; echo "bench e4b $w rc=$? $((SECONDS-s))s"; grep -E "^\| gemma|convert" "$R/bench-e4b-$w.txt" | head -6
  rm -f /tmp/e4b-$w.gguf
done
gemtune synth 12b q4_0 /tmp/12b-q4_0.gguf > /dev/null && sync
ab 12b-q4_0-aa /tmp/12b-q4_0.gguf
tar -C "$OUT" -czf "$OUT/callD.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
