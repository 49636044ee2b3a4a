#!/usr/bin/env bash
# GPU call D (one H200): main as committed (the norm tails bound on 8-warp
# GEMV blocks only: main's Q4_0 output and down projections) against main
# before this work (scripts/main-before.toml) on 31B, 12B and E4B Q4_0;
# the parity suite on this tree; the tail variants on the edge shapes;
# 31B Q4_0's bench and graph-decode phase table under main. Stage as for
# call A, then `run` with carry [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-norm-tail/scripts/callD.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 540
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
gpu_test cuda_parity 150
pack
mk() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync; }
B=reports/h200-2026-11-28-norm-tail/scripts/main-before.toml
mk 31b q4_0
gpu_ab 31b-q4 "$B" main 100 6 /tmp/31b-q4_0.gguf 512
pack
if [ "$(gpu_left)" -ge 60 ]; then
  timeout 60 gemtune bench -m /tmp/31b-q4_0.gguf -p 0 -n 64 -r 1 --profile-phases > "$R/phases-31b-q4_0.txt" 2>&1
  echo "phases 31b rc=$?"
fi
rm -f /tmp/31b-q4_0.gguf
pack
mk 12b q4_0
gpu_ab 12b-q4 "$B" main 70 6 /tmp/12b-q4_0.gguf 512
rm -f /tmp/12b-q4_0.gguf
pack
mk e4b q4_0
gpu_ab e4b-q4 "$B" main 50 10 /tmp/e4b-q4_0.gguf 512
rm -f /tmp/e4b-q4_0.gguf
pack
gpu_check gemv 60 --variant 'tail-*' --shapes edge --tokens 1,8
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
