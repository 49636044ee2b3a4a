#!/usr/bin/env bash
# GPU call A (one H100, about 10 minutes): what the sixth 2026-11-27 session built
# without a GPU (its device time was spent). Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-* \
#     .gpu/tests/gpu_moe-* .gpu/tests/cuda_parity-*) | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-q8-records/scripts/callA.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 470
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
# 1. strict on tiny-moe q4_k_m (its Q5_0 fallbacks now widened exactly to
#    Q8_0, no longer refused) and the rest of the MoE parity suite.
gpu_test cuda_moe 110
pack
# 2. gpu_moe with the sweeps' define sets compiled at once on the host's
#    cores (moe_gemv_variants_pass never finished inside 290 s before).
gpu_test gpu_moe 240
pack
# 3. 26B-A4B Q4_K_M: bench with the Q5_0 down stacks widened (the same
#    bytes as the requantized Q8_0 of before, so the same speed is
#    expected), run -v listing the widenings, and strict accepting the file.
m=/tmp/26b-q4km.gguf
s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
timeout 60 gemtune run -m $m -p "The" -n 8 -v > "$R/run-v-26b-q4km.txt" 2>&1; echo "run -v rc=$?"
grep -c "widened at load" "$R/run-v-26b-q4km.txt"; grep -c "converted at load" "$R/run-v-26b-q4km.txt"
timeout 60 gemtune run -m $m -p "The" -n 8 --profile strict > "$R/run-strict-26b-q4km.txt" 2>&1; echo "run strict rc=$?"
timeout 60 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q4_k_m.txt" 2> "$R/bench-26b-q4_k_m.log"
echo "bench rc=$?"; grep -E "^\| gemma" "$R/bench-26b-q4_k_m.txt"
rm -f $m
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
