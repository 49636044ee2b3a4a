#!/usr/bin/env bash
# GPU call B (one H100): the k-quant decode GEMV on split Q8 records written
# once per step by the input's producer (gemv ALGO 3, act_out.cuh and the
# quantize pre-pass with OUT=Q8_SPLIT). In order of what the verdict needs:
# the CUDA-vs-CPU parity suite (main now decodes k-quants on ALGO 3); the
# oracle checks of the new variants (partial tiles, 1..8 tokens) and of
# the producers' new output; `ab` of main against kq-split (ALGO 2, the
# split made per GEMV block) on E4B Q4_K_M; E4B Q4_K_M bench and device
# memory; the GEMV at m = 1 (dram) beside ALGO 2 and dp4a on Q8_1; the
# prefill GEMM per weight type; 31B Q4_K_M decode. Stage first (stage-gpu.sh), pack gemtune and the
# cuda_parity executable into .gpubase/stage.tar.xz, `run` with carry
# [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
gpu_test cuda_parity 150
pack
gpu_check gemv 50 --variant 'split-records*' --shapes decode_ktypes_check --shapes edge_ktypes
gpu_check quantize_q8_1 20 --variant 'split*'
gpu_check rmsnorm 20 --variant 'sandwich-q8-split'
gpu_check gelu_mul 20 --variant 'q8-split'
pack
gemtune synth e4b q4_k_m /tmp/e4b-q4km.gguf > /dev/null && sync
s=$SECONDS; timeout 80 gemtune ab --reps 8 --quiet --out "$R/ab-e4b-q4km" --baseline kq-split --candidate main -m /tmp/e4b-q4km.gguf -p 512 -n 128 > "$R/ab-e4b-q4km.txt" 2> "$R/ab-e4b-q4km.log"
echo "== ab e4b q4_k_m kq-split vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-q4km.txt"; rm -f "$R"/ab-e4b-q4km/worker-*.log
pack
timeout 40 gemtune run -v -m /tmp/e4b-q4km.gguf -p "hello" -n 2 > "$R/run-v-e4b-q4km.txt" 2>&1
grep -iE "weights|device memory|lossy|gemv@Q" "$R/run-v-e4b-q4km.txt" | head -8
s=$SECONDS; timeout 70 gemtune bench -m /tmp/e4b-q4km.gguf -p 512,2048 -n 128 -r 3 > "$R/bench-e4b-q4km.txt" 2> "$R/bench-e4b-q4km.log"
echo "bench e4b q4_k_m rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma|lossy" "$R/bench-e4b-q4km.txt" | head -6
s=$SECONDS; timeout 45 gemtune bench -m /tmp/e4b-q4km.gguf -p 0 -n 64 -r 1 --profile-phases > "$R/phases-e4b-q4km.txt" 2>&1; echo "phases rc=$? $((SECONDS - s)) s"
rm -f /tmp/e4b-q4km.gguf
pack
T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1 --no-reference"
V="--variant split-records* --variant split-dp4a+ROWS=2,WARPS=16 --variant planes-dp4a+KSPLIT=2,UNROLL=1"
S="--shape e4b_q4k --shape e4b_q5k --shape e4b_q6k --shape 31b_q4k --shape 31b_q6k"
s=$SECONDS; timeout 60 gemtune tune gemv --shapes decode_ktypes $S $T $V --out "$R/tune-gemv-records" > "$R/tune-gemv-records.txt" 2>&1
echo "tune gemv records rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemv-records/*.png
pack
# Issue 28's per-type prefill GEMM figure: main's wgmma GEMM (BM 256 and its
# neighbours, split-K 2 for ffn_down) on every type's FFN shapes at 2048
# tokens, dram, with the cuBLAS bf16 reference rows.
G="--budget-ms 30 --min-reps 5 --max-reps 30 --regime dram --tokens 2048"
s=$SECONDS; timeout 75 gemtune tune gemm_wgmma --shapes ffn_ktypes $G --variant 'wide+BM=256*' --variant 'split-k+BM=256*' --out "$R/tune-gemm-ktypes" > "$R/tune-gemm-ktypes.txt" 2>&1
echo "tune gemm ktypes rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemm-ktypes/*.png
pack
if [ "$(gpu_left)" -gt 120 ]; then
  s=$SECONDS; gemtune synth 31b q4_k_m /tmp/31b-q4km.gguf > /dev/null && sync; echo "synth 31b $((SECONDS - s)) s"
  s=$SECONDS; timeout $(( $(gpu_left) - 15 )) gemtune bench -m /tmp/31b-q4km.gguf -p 512 -n 128 -r 2 > "$R/bench-31b-q4km.txt" 2> "$R/bench-31b-q4km.log"
  echo "bench 31b q4_k_m rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma|lossy" "$R/bench-31b-q4km.txt" | head -6
  pack
  [ "$(gpu_left)" -gt 45 ] && timeout $(( $(gpu_left) - 10 )) gemtune run -v -m /tmp/31b-q4km.gguf -p "hello" -n 2 > "$R/run-v-31b-q4km.txt" 2>&1
  grep -iE "weights|device memory" "$R/run-v-31b-q4km.txt" | head -4
fi
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
