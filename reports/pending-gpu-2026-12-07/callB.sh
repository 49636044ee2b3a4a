#!/usr/bin/env bash
# GPU call B (one H100, about 9.5 minutes): the decode figures issue 22
# asks for, on main as committed: `bench -p 512 -n 128 -r 3` (tg rows with
# step_bytes, floor_ms and floor %) on E4B Q8_0, E2B Q8_0, 12B Q4_0 and
# 31B Q4_0, and E4B Q8_0 tg128 at depth 32768 (its figure over the depth-0
# one: issue 22 asks 0.85x). Each model is written into /tmp, measured and
# deleted; a step is skipped with a line when too little time is left.
# Stage as for call A (only .gpu/bin and .gpu/run.sh are needed), then
# `run` with carry [".gpubase"] and
#   bash reports/pending-gpu-2026-12-07/callB.sh
set -u
cd "$(dirname "$0")/../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
# bench_model NAME VARIANT WTYPE SECONDS ARGS...: synth, bench into $R/NAME.
bench_model() {
    local name=$1 v=$2 w=$3 need=$4
    shift 4
    [ "$(gpu_left)" -lt "$need" ] && { echo "$name: skipped (time)"; return; }
    local s=$SECONDS
    gemtune synth "$v" "$w" "/tmp/$v-$w.gguf" > /dev/null && sync
    timeout $(($(gpu_left) - 5)) gemtune bench -m "/tmp/$v-$w.gguf" "$@" -o csv \
        > "$R/$name.csv" 2> "$R/$name.log"
    echo "== $name rc=$? $((SECONDS - s)) s"
    grep -v "warm-up\|: rep " "$R/$name.log" | tail -6
    cut -d, -f1-40 "$R/$name.csv" | head -4
    rm -f "/tmp/$v-$w.gguf"
    pack
}
bench_model e4b-q8_0 e4b q8_0 90 -p 512 -n 128 -r 3
bench_model e4b-q8_0-d32768 e4b q8_0 120 -p 0 -n 128 -d 32768 -r 3
bench_model e2b-q8_0 e2b q8_0 70 -p 512 -n 128 -r 3
bench_model 12b-q4_0 12b q4_0 110 -p 512 -n 128 -r 3
bench_model 31b-q4_0 31b q4_0 150 -p 512 -n 128 -r 3
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
