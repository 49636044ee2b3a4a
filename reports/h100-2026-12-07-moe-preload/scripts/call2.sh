#!/usr/bin/env bash
# GPU call 2 (one GPU, at most 560 s): on 26B-A4B Q8_0, `ab` of main (its
# MoE step in stream order) against moe-preload (chained, expert GEMVs with
# PRELOAD); then issue 22's decode figures on main as committed:
# `bench -p 512 -n 128 -r 3` (tg rows with step MB, floor ms, floor %) on
# E4B Q8_0 and 31B Q4_0, E4B's graph-decode phase table, and E4B tg128 at
# depth 32768. Each model is written into /tmp, measured and deleted; a
# step is skipped with a line when too little time is left. Stage as for
# call 1 (.gpu/bin and .gpu/run.sh), `run` with carry [".gpubase"] and
#   bash reports/h100-2026-12-07-moe-preload/scripts/call2.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/call2.tgz" r; }
P=variants/profiles/moe-preload.toml
s=$SECONDS
gemtune synth 26b-a4b q8_0 /tmp/26b-q8_0.gguf > /dev/null && sync
echo "synth 26b-a4b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-main-preload main "$P" 150 6 /tmp/26b-q8_0.gguf 512
rm -f /tmp/26b-q8_0.gguf
pack
# bench_model NAME VARIANT WTYPE SECONDS ARGS...: synth (kept for the next
# call of the same model), bench into $R/NAME.
bench_model() {
    local name=$1 v=$2 w=$3 need=$4
    shift 4
    [ "$(gpu_left)" -lt "$need" ] && { echo "$name: skipped (time)"; return; }
    local s=$SECONDS
    [ -f "/tmp/$v-$w.gguf" ] || { gemtune synth "$v" "$w" "/tmp/$v-$w.gguf" > /dev/null && sync; }
    timeout $(($(gpu_left) - 5)) gemtune bench -m "/tmp/$v-$w.gguf" "$@" -o csv \
        > "$R/$name.csv" 2> "$R/$name.log"
    echo "== $name rc=$? $((SECONDS - s)) s"
    grep -v "warm-up\|: rep " "$R/$name.log" | tail -24
    pack
}
bench_model e4b-q8_0 e4b q8_0 70 -p 512 -n 128 -r 3
bench_model e4b-q8_0-phases e4b q8_0 40 -p 0 -n 64 -r 1 --profile-phases
bench_model e4b-q8_0-d32768 e4b q8_0 100 -p 0 -n 128 -d 32768 -r 2
rm -f /tmp/e4b-q8_0.gguf
bench_model 31b-q4_0 31b q4_0 140 -p 512 -n 128 -r 3
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
