#!/usr/bin/env bash
# GPU call A (one H200, about 9 minutes): the decode GEMVs of the k-quant and
# 16-bit types and the expert GEMVs timed in the three launch modes of
# `tune --launches` (stream, graph, chained), the new moe_gemv points checked
# against the oracle, and the launch-mode test. Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cli_tune-* \
#     .gpu/tests/cuda_moe-*) | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-launch-modes/scripts/callA.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 550
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
MOE_CHECK="--variant gate-up-split-records+HOIST=* --variant down-records+MINB=* --tokens 1,3,8"
MOE_TUNE="--variant gate-up-split-records --variant gate-up-split-records+HOIST=* --variant down-records --variant down-records+MINB=*"
T="--budget-ms 30 --min-reps 20 --max-reps 100 --regime dram --no-reference --tokens 1"
tune() {
  local name=$1 to=$2 fam=$3; shift 3
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune "$fam" $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png
  pack
}
# 1. The launch-mode test (tune --launches graph / chained on edge.partial).
gpu_test cli_tune 60 tune_records_its_launch_mode
pack
# 2. The new expert GEMV points against the oracle (every moe shape).
gpu_check moe_gemv 90 $MOE_CHECK
pack
# 3. The expert GEMVs at one token, 26B-A4B Q8_0 and Q4_K, each launch mode.
for mode in stream chained graph; do
  tune "moe-$mode" 55 moe_gemv --launches $mode --shape moe_gemv.a4b_q8 --shape moe_gemv.a4b_q4k $MOE_TUNE
done
# 4. The decode GEMV of the k-quant and 16-bit types at E4B and 31B FFN
#    shapes: main's point (split-records) and its sweep, the FMA form.
for mode in stream chained graph; do
  tune "gemv-$mode" 75 gemv --launches $mode --shapes decode_ktypes --shape e4b_ --shape 31b_ \
    --variant split-records --variant 'split-records+*' --variant planes-fma
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
