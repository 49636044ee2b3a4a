#!/usr/bin/env bash
# GPU call D (one H100): the checks call C left unfinished (the records
# epilogue after the refactor, every cell), E4B decode at depth 32768, and
# E4B's graph-decode phase table on main as committed. Same stage as call C;
# `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-moe-records/scripts/callD.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 450
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
S=reports/h100-2026-11-28-moe-records/scripts
gpu_check gemv 150 --variant fused-records --variant split-records --variant gelu-side-records \
  --shapes decode --shapes edge --shapes $S/ple.toml --tokens 1,3,8
pack
timeout 120 gemtune check moe_gemv --variant gate-up-split-records --variant gate-up-split-records-count \
  --variant gate-up-records --variant down-records --variant down-records-count \
  --out /tmp/chk-moe > "$R/check-moe_gemv.txt" 2>&1; echo "check moe_gemv rc=$?"; tail -1 "$R/check-moe_gemv.txt"
cp /tmp/chk-moe/check.csv "$R/check-moe_gemv.csv" 2>/dev/null
pack
m=/tmp/e4b-q8_0.gguf
gemtune synth e4b q8_0 $m > /dev/null && sync
if [ "$(gpu_left)" -ge 70 ]; then
  s=$SECONDS
  timeout 70 gemtune bench -m $m -p 0 -n 128 -d 32768 -r 2 > "$R/bench-e4b-d32768.txt" 2> "$R/bench-e4b-d32768.log"
  echo "bench d32768 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-d32768.txt"
fi
pack
if [ "$(gpu_left)" -ge 40 ]; then
  s=$SECONDS
  timeout 40 gemtune bench -m $m -p 0 -n 64 -r 1 --profile-phases > "$R/phases-e4b-q8.txt" 2>&1
  echo "phases rc=$? $((SECONDS - s)) s"
fi
rm -f $m
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
