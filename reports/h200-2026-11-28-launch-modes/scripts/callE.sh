#!/usr/bin/env bash
# GPU call E (one H200, about 2 minutes): the launch-mode test and one small
# tune in each mode on the tree after the timing helpers were shared
# (039c095: one capture helper for the sample graph and the launch floors).
# Stage as for call A (.gpu/tests/cli_tune-* in the tarball), then `run`
# with carry [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-launch-modes/scripts/callE.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 200
pack() { tar -C "$OUT" -czf "$OUT/callE.tgz" r; }
gpu_test cli_tune 60 tune_records_its_launch_mode
pack
for mode in stream graph chained; do
  s=$SECONDS
  timeout 40 gemtune tune gemv --launches $mode --shapes decode_ktypes --shape e4b_q4k.ffn_up --tokens 1 \
    --regime dram --no-reference --budget-ms 30 --variant split-records --out "$R/tune-$mode" > "$R/tune-$mode.txt" 2>&1
  echo "tune $mode rc=$? $((SECONDS - s)) s"
  grep "launch floor" "$R/tune-$mode/summary.md"
  grep -E "^\| gemv.e4b_q4k|^\| decode_ktypes|e4b_q4k.ffn_up@m=1 \|" "$R/tune-$mode/summary.md" | head -2
  rm -f "$R/tune-$mode"/*.png "$R/tune-$mode/cells.jsonl"
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
