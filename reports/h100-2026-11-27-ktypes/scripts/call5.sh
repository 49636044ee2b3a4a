#!/usr/bin/env bash
# GPU call 5 (one H100), the session's last: gemv ALGO 2 after its split
# was rewritten (batched loads, one-instruction warp reductions, the first
# weight lines prefetched into L2 during the split): checked on the k-quant
# check shapes, tuned at m = 1 (dram) against dp4a on Q8_1 and main's FMA
# form; main (k-quant slots on ALGO 2) against its FMA form end to end on
# E4B Q4_K_M; the whole CUDA-vs-CPU parity suite on this tree.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 370
pack() { tar -C "$OUT" -czf "$OUT/call5.tgz" r; }
gpu_check gemv 60 --variant 'split*' --shapes decode_ktypes_check --shapes edge_ktypes
pack
T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1 --no-reference"
V="--variant split* --variant planes-fma+ROWS=2,WARPS=2 --variant h100-dp4a --variant planes-dp4a+KSPLIT=2,UNROLL=1"
S="--shape e4b_q4k --shape e4b_q6k --shape 31b_q4k --shape 31b_q6k"
s=$SECONDS; timeout 60 gemtune tune gemv --shapes decode_ktypes $S $T $V --out "$R/tune-gemv-split" > "$R/tune-gemv-split.txt" 2>&1
echo "tune gemv split rc=$? $((SECONDS - s)) s"; pack
P=reports/h100-2026-11-27-ktypes/scripts/fma-ktypes.toml
gemtune synth e4b q4_k_m /tmp/e4b-q4km.gguf > /dev/null && sync
s=$SECONDS; timeout 70 gemtune ab --reps 8 --quiet --out "$R/ab-e4b-q4km" --baseline $P --candidate main -m /tmp/e4b-q4km.gguf -p 512 -n 128 > "$R/ab-e4b-q4km.txt" 2> "$R/ab-e4b-q4km.log"
echo "== ab e4b q4_k_m fma-ktypes vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-q4km.txt"; rm -f "$R"/ab-e4b-q4km/worker-*.log
rm -f /tmp/e4b-q4km.gguf; pack
gpu_test cuda_parity 180
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
