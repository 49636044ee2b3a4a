#!/usr/bin/env bash
# GPU call A (one H100): the CUDA engine's mixture-of-experts block
# (engine/src/cuda/moe.rs) seen on a GPU for the first time. In order of
# what the verdict needs: CUDA-vs-CPU parity on tiny-moe (strict, main,
# graph vs eager); the dense parity suite (the layer end now reads the FFN
# output through `ffn_output`); then 26B-A4B Q8_0 and Q4_K_M: `run -v`
# (plan and device memory), `bench` pp512 / tg128, and a phase table of
# graph decode. Stage first (stage-gpu.sh), pack gemtune and the test
# executables into .gpubase/stage.tar.xz, `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 590
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
gpu_test cuda_moe 150
pack
gpu_test cuda_parity 170
pack
# embed LAYOUT=1 (the gather reading a Q6_K table from the GEMV's plane
# repack), never run on a GPU before: the shared tied-head copy needs it.
gpu_check embed 40 --variant 'q6k-planes' --variant 'rows-q6k-planes'
pack
for w in q8_0 q4_k_m; do
  [ "$(gpu_left)" -lt 90 ] && { echo "26b $w: skipped (time)"; continue; }
  m=/tmp/26b-$w.gguf
  s=$SECONDS; gemtune synth 26b-a4b $w $m > /dev/null && sync; echo "synth 26b $w $((SECONDS - s)) s"
  timeout 60 gemtune run -v -m $m -p "hello" -n 4 > "$R/run-v-26b-$w.txt" 2>&1
  echo "run -v 26b $w rc=$?"; grep -iE "weights|device memory|lossy|moe" "$R/run-v-26b-$w.txt" | head -12
  s=$SECONDS; timeout 120 gemtune bench -m $m -p 512 -n 128 -r 2 > "$R/bench-26b-$w.txt" 2> "$R/bench-26b-$w.log"
  echo "bench 26b $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma|lossy" "$R/bench-26b-$w.txt" | head -6; tail -3 "$R/bench-26b-$w.log"
  s=$SECONDS; timeout 60 gemtune bench -m $m -p 0 -n 32 -r 1 --profile-phases > "$R/phases-26b-$w.txt" 2>&1; echo "phases rc=$? $((SECONDS - s)) s"
  rm -f $m
  pack
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
