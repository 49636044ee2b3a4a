#!/usr/bin/env bash
# GPU call C (one H100): the MoE prefill on the grouped expert GEMMs
# (moe_gemm) in the engine, the expert GEMV's DOWN with 4 experts' loads in
# flight, and main's tuned MoE slots. In order: the kernel tests of the MoE
# families (moe_route, moe_gemv with the new DOWN, moe_gemm's stages and
# chain); the engine's MoE parity tests (tiny-moe, and a tiny-moe whose
# widths run moe_gemm); the dense parity suite (16-bit matrices no longer
# pull f32 scale planes into their group); 26B-A4B Q8_0 and Q4_K_M bench
# (pp512, pp2048, tg128) and a decode phase table; moe_gemv DOWN timed at
# 26B-A4B's decode shape. Stage first, pack gemtune and the
# test executables into .gpubase/stage.tar.xz, `run` with carry
# [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
gpu_test gpu_moe 80
pack
gpu_test cuda_moe 130
pack
gpu_test cuda_parity 150
pack
for w in q8_0 q4_k_m; do
  [ "$(gpu_left)" -lt 100 ] && { echo "26b $w: skipped (time)"; continue; }
  m=/tmp/26b-$w.gguf
  s=$SECONDS; gemtune synth 26b-a4b $w $m > /dev/null && sync; echo "synth 26b $w $((SECONDS - s)) s"
  s=$SECONDS; timeout 110 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-$w.txt" 2> "$R/bench-26b-$w.log"
  echo "bench 26b $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-$w.txt" | head -6; tail -2 "$R/bench-26b-$w.log"
  if [ $w = q8_0 ]; then
    s=$SECONDS; timeout 50 gemtune bench -m $m -p 0 -n 32 -r 1 --profile-phases > "$R/phases-26b-$w.txt" 2>&1; echo "phases rc=$? $((SECONDS - s)) s"
  fi
  rm -f $m
  pack
done
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
s=$SECONDS; timeout 40 gemtune tune moe_gemv --shape moe_gemv.a4b_q8 --tokens 1 --variant 'down*' $T --out "$R/tune-moe_gemv-down" > "$R/tune-moe_gemv-down.txt" 2>&1
echo "tune moe_gemv down rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv-down/*.png
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
