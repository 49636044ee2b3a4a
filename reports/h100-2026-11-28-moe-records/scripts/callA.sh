#!/usr/bin/env bash
# GPU call A (one H100, about 10 minutes): the expert down GEMV on the split
# records its gate|up writes (moe_gemv ALGO 3, H_RECORDS=1). Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-* \
#     .gpu/tests/gpu_moe-* .gpu/tests/cuda_parity-*) | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-moe-records/scripts/callA.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
tune() {
  local name=$1 to=$2; shift 2
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune moe_gemv --tokens 1 $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png
  pack
}
# 1. The new points against the oracle on every moe shape (partial and
#    shared experts, 1-8 tokens, Q8_0 / Q4_0 / Q4_K, byte counts).
gpu_check moe_gemv 90 --variant gate-up-split-records --variant gate-up-split-records-count \
  --variant gate-up-records --variant down-records --variant down-records-count
pack
# 2. One token, dram: the records points against main's previous ones.
tune q8 110 --shape moe_gemv.a4b_q8 --variant 'down-split+KSPLIT=4,ROWS=4,UNROLL=1,WARPS=8' \
  --variant down-records --variant 'down-records+*' --variant gate-up-split \
  --variant gate-up-split-records --variant 'gate-up-split-records+*'
# 3. The MoE parity suite on main (now records) and the other arms.
gpu_test cuda_moe 130
pack
# 4. End to end, 26B-A4B Q8_0.
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-q8 variants/profiles/moe-split.toml main 90 8 $m 512
pack
if [ "$(gpu_left)" -ge 55 ]; then
  s=$SECONDS
  timeout 55 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0.txt" 2> "$R/bench-26b-q8_0.log"
  echo "bench 26b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0.txt"
fi
rm -f $m
pack
tune q4 40 --shape moe_gemv.a4b_q4 --variant 'down-split+KSPLIT=4,ROWS=4,UNROLL=1,WARPS=8' \
  --variant down-records --variant gate-up-split --variant gate-up-split-records
tune q4k 30 --shape moe_gemv.a4b_q4k --variant 'gate-up-split+ROWS=1,UNROLL=1,WARPS=8' --variant gate-up-split-records
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
