#!/usr/bin/env bash
# GPU call 1 (one H100, at most 560 s): moe_gemv PRELOAD=1 on the GPU.
# The two PRELOAD variants and the forms they extend against the oracle,
# cuda_moe's chained tests (the moe-preload bit-identity test among them),
# the four at one token on 26B-A4B Q8_0 shapes (dram, chained and stream
# launches), then `ab` of moe-chained.toml (main, its MoE step chained)
# against moe-preload on 26B-A4B Q8_0. Stage here first:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-*) \
#     | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] and
#   bash reports/h100-2026-12-07-moe-preload/scripts/call1.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/call1.tgz" r; }
S=reports/h100-2026-12-07-moe-preload/scripts
P=variants/profiles/moe-preload.toml
V=(--variant down-records-preload --variant gate-up-split-records-preload
   --variant down-records --variant gate-up-split-records)
gpu_check moe_gemv 100 "${V[@]}"
pack
gpu_test cuda_moe 130 chained
pack
for mode in chained stream; do
    [ "$(gpu_left)" -lt 250 ] && { echo "tune $mode: skipped (time)"; continue; }
    s=$SECONDS
    timeout 60 gemtune tune moe_gemv --shape moe_gemv.a4b_q8 --tokens 1 --regime dram \
        --launches "$mode" --budget-ms 25 "${V[@]}" --out "$R/tune-$mode" \
        > "$R/tune-$mode.txt" 2>&1
    echo "tune $mode rc=$? $((SECONDS - s)) s"
    rm -rf "$R/tune-$mode"/*.png "$R/tune-$mode"/cells.jsonl
    tail -12 "$R/tune-$mode.txt"
done
pack
s=$SECONDS
gemtune synth 26b-a4b q8_0 /tmp/26b-q8_0.gguf > /dev/null && sync
echo "synth 26b-a4b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-chained-preload "$S/moe-chained.toml" "$P" 170 8 /tmp/26b-q8_0.gguf 512
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
