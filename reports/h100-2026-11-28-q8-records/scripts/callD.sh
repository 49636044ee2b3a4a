#!/usr/bin/env bash
# GPU call D (one H100): main's Q8_0 gate|up fused (gate and up rows in one
# GEMV on split records, gelu(gate) * up written straight as down's split
# records, OUT=Q8_SPLIT; no gelu_mul launch). In order of what the verdict
# needs: the oracle checks of the fused-records variant (1..8 tokens,
# partial k, whole 32-row records); the CUDA-vs-CPU parity suite (main now
# fuses on Q8_0 models); `ab` of q8-unfused (main as call C left it)
# against main on E4B Q8_0; the GEMV at m = 1; benches and the phase
# table; 26B-A4B as time allows. Stage first (stage-gpu.sh), pack gemtune
# and the cuda_parity executable into .gpubase/stage.tar.xz, `run` with
# carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 580
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
S=reports/h100-2026-11-28-q8-records/scripts
gpu_check gemv 80 --variant 'fused-records*' --shapes decode --shapes $S/records-edge.toml --shape records --shape e4b.ffn --shape e4b_q4 --shape 12b.ffn
pack
gpu_test cuda_parity 150
pack
gemtune synth e4b q8_0 /tmp/e4b.gguf > /dev/null && sync
s=$SECONDS; timeout 100 gemtune ab --reps 16 --quiet --out "$R/ab-e4b-fused" --baseline $S/q8-unfused.toml --candidate main -m /tmp/e4b.gguf -p 512 -n 128 > "$R/ab-e4b-fused.txt" 2> "$R/ab-e4b-fused.log"
echo "== ab e4b q8_0 q8-unfused vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-fused.txt"; rm -f "$R"/ab-e4b-fused/worker-*.log "$R"/ab-e4b-fused/*.png
pack
timeout 30 gemtune run -v -m /tmp/e4b.gguf -p "hello" -n 2 > "$R/run-v-e4b-q8.txt" 2>&1
grep -E "^gemv|^gelu" "$R/run-v-e4b-q8.txt" | head -12
s=$SECONDS; timeout 60 gemtune bench -m /tmp/e4b.gguf -p 512,2048 -n 128 -r 3 > "$R/bench-e4b-q8.txt" 2> "$R/bench-e4b-q8.log"
echo "bench e4b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-q8.txt" | head -6
s=$SECONDS; timeout 40 gemtune bench -m /tmp/e4b.gguf -p 0 -n 64 -r 1 --profile-phases > "$R/phases-e4b-q8-main.txt" 2>&1; echo "phases e4b rc=$? $((SECONDS - s)) s"
rm -f /tmp/e4b.gguf
pack
T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1 --no-reference"
V="--variant fused-records* --variant split-records+KSPLIT=1 --variant fused-gate-up"
s=$SECONDS; timeout 40 gemtune tune gemv --shapes decode --shape e4b.ffn_up --shape 12b.ffn_up $T $V --out "$R/tune-gemv-fused" > "$R/tune-gemv-fused.txt" 2>&1
echo "tune gemv fused rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemv-fused/*.png
pack
if [ "$(gpu_left)" -gt 60 ]; then
  gemtune synth e2b q8_0 /tmp/e2b.gguf > /dev/null && sync
  s=$SECONDS; timeout 40 gemtune bench -m /tmp/e2b.gguf -p 512 -n 128 -r 3 > "$R/bench-e2b-q8.txt" 2> "$R/bench-e2b-q8.log"
  echo "bench e2b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e2b-q8.txt" | head -6
  rm -f /tmp/e2b.gguf
fi
pack
if [ "$(gpu_left)" -gt 110 ]; then
  s=$SECONDS; gemtune synth 26b-a4b q8_0 /tmp/26b.gguf > /dev/null && sync; echo "synth 26b $((SECONDS - s)) s"
  s=$SECONDS; timeout $(( $(gpu_left) - 10 )) gemtune ab --reps 8 --quiet --out "$R/ab-26b-fused" --baseline $S/q8-unfused.toml --candidate main -m /tmp/26b.gguf -p 512 -n 128 > "$R/ab-26b-fused.txt" 2> "$R/ab-26b-fused.log"
  echo "== ab 26b-a4b q8_0 q8-unfused vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-26b-fused.txt"; rm -f "$R"/ab-26b-fused/worker-*.log "$R"/ab-26b-fused/*.png
  rm -f /tmp/26b.gguf
fi
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
