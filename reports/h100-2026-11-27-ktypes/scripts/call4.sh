#!/usr/bin/env bash
# GPU call 4 (one H100): gemv ALGO 2 (dp4a on split Q8 activations made
# per block) checked on every spec shape it accepts (partial tiles, 1..8
# tokens), tuned at m = 1 and 8 (dram) against dp4a on Q8_1 and the FMA
# forms on the k-quant shapes, then main (k-quant slots on ALGO 2) against its FMA form end
# to end on E4B Q4_K_M and 31B Q4_K_M (`ab`, decode and prefill), and
# the CUDA-vs-CPU parity of main on every native type.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/call4.tgz" r; }
gpu_check gemv 90 --variant 'split*'
pack
T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1,8 --no-reference"
V="--variant split* --variant xsmem-fma+ROWS=1,WARPS=16 --variant planes-fma+ROWS=2,WARPS=2 --variant h100-dp4a --variant planes-dp4a+KSPLIT=2,UNROLL=1"
s=$SECONDS; timeout 130 gemtune tune gemv --shapes decode_ktypes $T $V --out "$R/tune-gemv-split" > "$R/tune-gemv-split.txt" 2>&1
echo "tune gemv split rc=$? $((SECONDS - s)) s"; pack
P=reports/h100-2026-11-27-ktypes/scripts/fma-ktypes.toml
for v in e4b 31b; do
  [ "$(gpu_left)" -lt 100 ] && break
  gemtune synth $v q4_k_m /tmp/$v-q4km.gguf > /dev/null && sync
  s=$SECONDS; timeout 130 gemtune ab --reps 8 --quiet --out "$R/ab-$v-q4km" --baseline $P --candidate main -m /tmp/$v-q4km.gguf -p 512 -n 128 > "$R/ab-$v-q4km.txt" 2> "$R/ab-$v-q4km.log"
  echo "== ab $v q4_k_m fma-ktypes vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$v-q4km.txt"; rm -f "$R"/ab-$v-q4km/worker-*.log
  rm -f /tmp/$v-q4km.gguf; pack
done
gpu_test cuda_parity 100 every_native_type
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
