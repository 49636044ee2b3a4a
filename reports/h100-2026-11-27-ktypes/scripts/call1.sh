#!/usr/bin/env bash
# GPU call 1 (one H100): the decode GEMV of every k-quant and 16-bit type at
# E4B/12B/31B FFN shapes and the tied head (m = 1, dram regime: issue 28's
# per-type figure), then where E4B Q4_K_M decode spends its step (main and
# dp4a, graph-decode phases), the E4B bf16 and 31B q4_k_m benches with the
# device memory `run -v` reports. Stage first (stage-gpu.sh), pack gemtune
# into .gpubase/stage.tar.xz, `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 580
T="--budget-ms 40 --min-reps 10 --max-reps 60 --regime dram --tokens 1"
s=$SECONDS; timeout 200 gemtune tune gemv --shapes decode_ktypes $T --out "$R/tune-gemv-ktypes" > "$R/tune-gemv-ktypes.txt" 2>&1
echo "tune gemv ktypes rc=$? $((SECONDS - s)) s"
s=$SECONDS; timeout 90 gemtune tune gemv --shapes head --shape e4b.head $T --out "$R/tune-gemv-head" > "$R/tune-gemv-head.txt" 2>&1
echo "tune gemv head rc=$? $((SECONDS - s)) s"
bench() { # tag model args...
  local tag=$1 m=$2; shift 2
  local s=$SECONDS
  timeout 120 gemtune bench -m "$m" "$@" > "$R/bench-$tag.txt" 2> "$R/bench-$tag.log"
  echo "bench $tag rc=$? $((SECONDS - s)) s"
  grep -E "^\| gemma|lossy" "$R/bench-$tag.txt" | head -8
}
gemtune synth e4b q4_k_m /tmp/e4b-q4km.gguf > /dev/null && sync
timeout 60 gemtune run -v -m /tmp/e4b-q4km.gguf -p "hello" -n 2 > "$R/run-v-e4b-q4km.txt" 2>&1
grep -iE "weights|device memory|lossy" "$R/run-v-e4b-q4km.txt" | head -6
bench e4b-q4km-main /tmp/e4b-q4km.gguf -p 512,2048 -n 128 -r 3
bench e4b-q4km-dp4a /tmp/e4b-q4km.gguf -p 0 -n 128 -r 3 --profile dp4a
s=$SECONDS; timeout 90 gemtune bench -m /tmp/e4b-q4km.gguf -p 0 -n 64 -r 1 --profile-phases > "$R/phases-e4b-q4km-main.txt" 2>&1; echo "phases main rc=$? $((SECONDS - s)) s"
s=$SECONDS; timeout 90 gemtune bench -m /tmp/e4b-q4km.gguf -p 0 -n 64 -r 1 --profile-phases --profile dp4a > "$R/phases-e4b-q4km-dp4a.txt" 2>&1; echo "phases dp4a rc=$? $((SECONDS - s)) s"
rm -f /tmp/e4b-q4km.gguf
if [ "$(gpu_left)" -gt 100 ]; then
  gemtune synth e4b bf16 /tmp/e4b-bf16.gguf > /dev/null && sync
  timeout 60 gemtune run -v -m /tmp/e4b-bf16.gguf -p "hello" -n 2 > "$R/run-v-e4b-bf16.txt" 2>&1
  bench e4b-bf16-main /tmp/e4b-bf16.gguf -p 512,2048 -n 128 -r 3
  rm -f /tmp/e4b-bf16.gguf
fi
if [ "$(gpu_left)" -gt 150 ]; then
  s=$SECONDS; gemtune synth 31b q4_k_m /tmp/31b-q4km.gguf > /dev/null && sync; echo "synth 31b $((SECONDS - s)) s"
  timeout 90 gemtune run -v -m /tmp/31b-q4km.gguf -p "hello" -n 2 > "$R/run-v-31b-q4km.txt" 2>&1
  bench 31b-q4km-main /tmp/31b-q4km.gguf -p 512,2048 -n 128 -r 3
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
