#!/usr/bin/env bash
# GPU call 3 (one H100, at most 420 s), NOT RUN in the session that wrote
# it (its device time ran out; see the README): the router launched before
# the shared MLP and the expert gate|up's whole prologue before its wait
# (moe_gemv PRELOAD=2, profile moe-early), and the tune command after its
# split into a module.
#   1. cuda_moe's chained tests: moe-preload's and moe-early's chained
#      decode against main's plain decode, bit for bit, on tiny-moe;
#   2. the PRELOAD=2 variants against the oracle on every moe shape;
#   3. the gate|up forms at one token on 26B-A4B Q8_0, Q4_0 and Q4_K
#      shapes, dram, chained launches (the tune command's first GPU run
#      since the split);
#   4. `ab` on 26B-A4B Q8_0 of main -> moe-early (8 reps) and moe-preload
#      -> moe-early (6 reps: PRELOAD=2 and the early router alone);
#   5. cli_tune's GPU tests in the time left.
# Stage here first:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-* \
#     .gpu/tests/cli_tune-*) | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] and
#   bash reports/h100-2026-12-07-moe-preload/scripts/call3.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 420
pack() { tar -C "$OUT" -czf "$OUT/call3.tgz" r; }
E=variants/profiles/moe-early.toml
V=(--variant gate-up-split-records-preload2 --variant gate-up-split-records-preload2-minb2)
gpu_test cuda_moe 60 chained
pack
gpu_check moe_gemv 60 "${V[@]}"
pack
[ "$(gpu_left)" -gt 250 ] && {
    s=$SECONDS
    timeout 40 gemtune tune moe_gemv --shape moe_gemv.a4b_q --tokens 1 --regime dram \
        --launches chained --budget-ms 25 "${V[@]}" --variant gate-up-split-records-preload \
        --variant gate-up-split-records-hoist --variant gate-up-split-records-hoist-minb2 \
        --out "$R/tune-chained" > "$R/tune-chained.txt" 2>&1
    echo "tune chained rc=$? $((SECONDS - s)) s"
    rm -rf "$R/tune-chained"/*.png "$R/tune-chained"/cells.jsonl
}
pack
s=$SECONDS
gemtune synth 26b-a4b q8_0 /tmp/26b-q8_0.gguf > /dev/null && sync
echo "synth 26b-a4b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-main-early main "$E" 90 8 /tmp/26b-q8_0.gguf 512
pack
gpu_ab 26b-preload-early variants/profiles/moe-preload.toml "$E" 75 6 /tmp/26b-q8_0.gguf 512
pack
rm -f /tmp/26b-q8_0.gguf
gpu_test cli_tune 60
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
