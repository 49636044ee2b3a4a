#!/usr/bin/env bash
# GPU call 1b (call 1's machine, warm): call 1 again for the files it could
# not bring back (too many files under $OUT: everything is packed into one
# tarball now): the per-type GEMV tune, the head tune (fewer variants), the
# E4B Q4_K_M graph-decode phase tables and `run -v` memory lines.
set -u
cd "$(dirname "$0")/../../.."
[ -x .gpu/bin/gemtune ] || tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/call1b.tgz" r; }
T="--budget-ms 40 --min-reps 10 --max-reps 60 --regime dram --tokens 1"
s=$SECONDS; timeout 200 gemtune tune gemv --shapes decode_ktypes $T --out "$R/tune-gemv-ktypes" > "$R/tune-gemv-ktypes.txt" 2>&1
echo "tune gemv ktypes rc=$? $((SECONDS - s)) s"; pack
gemtune synth e4b q4_k_m /tmp/e4b-q4km.gguf > /dev/null && sync
timeout 60 gemtune run -v -m /tmp/e4b-q4km.gguf -p "hello" -n 2 > "$R/run-v-e4b-q4km.txt" 2>&1
for p in main dp4a; do
  timeout 90 gemtune bench -m /tmp/e4b-q4km.gguf -p 0 -n 64 -r 1 --profile-phases --profile $p > "$R/phases-e4b-q4km-$p.txt" 2>&1; echo "phases $p rc=$?"
done
pack
s=$SECONDS; timeout 150 gemtune tune gemv --shapes head --shape e4b.head $T --variant 'planes-*' --variant head-q6k --out "$R/tune-gemv-head" > "$R/tune-gemv-head.txt" 2>&1
echo "tune gemv head rc=$? $((SECONDS - s)) s"; pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
