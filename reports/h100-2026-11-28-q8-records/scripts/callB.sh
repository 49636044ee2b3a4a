#!/usr/bin/env bash
# GPU call B (one H100): Q8_0 decode GEMVs on dp4a over split Q8 records
# (gemv ALGO 3 on Q8_0 and Q4_0 planes, new; main's `gemv@Q8_0`, with O and
# PLE kept on FMA). In order of what the verdict needs: the oracle checks
# of the split-records variants on Q8_0/Q4_0 (partial tiles, 1..8 tokens);
# the CUDA-vs-CPU parity suite; `ab` of q8-fma (main before) against main
# on E4B Q8_0 and 26B-A4B Q8_0; benches with the floor column; the GEMV at
# m = 1 (dram) beside FMA and dp4a on Q8_1. Stage first (stage-gpu.sh),
# pack gemtune and the cuda_parity executable into .gpubase/stage.tar.xz,
# `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
gpu_check gemv 70 --variant 'split-records*' --shapes edge --shapes decode --shape edge --shape e4b.ffn --shape e4b.attn_k --shape e4b_q4 --shape 12b.ffn_down
pack
gemtune synth e4b q8_0 /tmp/e4b.gguf > /dev/null && sync
s=$SECONDS; timeout 100 gemtune ab --reps 16 --quiet --out "$R/ab-e4b-q8" --baseline q8-fma --candidate main -m /tmp/e4b.gguf -p 512 -n 128 > "$R/ab-e4b-q8.txt" 2> "$R/ab-e4b-q8.log"
echo "== ab e4b q8_0 q8-fma vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-q8.txt"; rm -f "$R"/ab-e4b-q8/worker-*.log
pack
timeout 30 gemtune run -v -m /tmp/e4b.gguf -p "hello" -n 2 > "$R/run-v-e4b-q8.txt" 2>&1
grep -E "^gemv|quantize" "$R/run-v-e4b-q8.txt" | head -12
s=$SECONDS; timeout 60 gemtune bench -m /tmp/e4b.gguf -p 512,2048 -n 128 -r 3 > "$R/bench-e4b-q8.txt" 2> "$R/bench-e4b-q8.log"
echo "bench e4b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-q8.txt" | head -6
rm -f /tmp/e4b.gguf
pack
gpu_test cuda_parity 150
pack
T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1 --no-reference"
V="--variant split-records* --variant planes-fma+ROWS=2,WARPS=2 --variant planes-dp4a+KSPLIT=2,UNROLL=1 --variant h100-dp4a"
S="--shape e4b.ffn --shape e4b.attn_q --shape e4b.attn_k --shape e4b_q4 --shape 12b.ffn"
s=$SECONDS; timeout 50 gemtune tune gemv --shapes decode $S $T $V --out "$R/tune-gemv-q8-records" > "$R/tune-gemv-q8-records.txt" 2>&1
echo "tune gemv q8 records rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemv-q8-records/*.png
pack
if [ "$(gpu_left)" -gt 110 ]; then
  s=$SECONDS; gemtune synth 26b-a4b q8_0 /tmp/26b.gguf > /dev/null && sync; echo "synth 26b $((SECONDS - s)) s"
  s=$SECONDS; timeout $(( $(gpu_left) - 10 )) gemtune ab --reps 8 --quiet --out "$R/ab-26b-q8" --baseline q8-fma --candidate main -m /tmp/26b.gguf -p 512 -n 128 > "$R/ab-26b-q8.txt" 2> "$R/ab-26b-q8.log"
  echo "== ab 26b-a4b q8_0 q8-fma vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-26b-q8.txt"; rm -f "$R"/ab-26b-q8/worker-*.log
  rm -f /tmp/26b.gguf
fi
pack
if [ "$(gpu_left)" -gt 40 ]; then
  gemtune synth e2b q8_0 /tmp/e2b.gguf > /dev/null && sync
  s=$SECONDS; timeout $(( $(gpu_left) - 5 )) gemtune bench -m /tmp/e2b.gguf -p 512 -n 128 -r 3 > "$R/bench-e2b-q8.txt" 2> "$R/bench-e2b-q8.log"
  echo "bench e2b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e2b-q8.txt" | head -6
fi
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
