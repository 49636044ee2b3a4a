#!/usr/bin/env bash
# GPU call B (one H100): 26B-A4B after the MoE decode changes, against the
# binary of the previous main (0df515c, staged as gemtune-prev) in the same
# call. In order: synth 26B-A4B Q8_0; bench -p 512,2048 -n 128 -r 3 with
# this main and with the previous one; a graph-decode phase table (tg32)
# of this main; `ab` of the fused gate|up GELU GEMV (fused-gelu.toml)
# against main on 26B-A4B Q8_0 and on E4B Q8_0; then 26B-A4B Q4_K_M bench
# with both binaries. Stage first (release gemtune, gemtune-prev),
# `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
P=reports/h100-2026-11-27-moe-decode/scripts
bench2() {  # bench2 MODEL TAG: this main, then the previous main
    for b in gemtune gemtune-prev; do
        [ "$(gpu_left)" -lt 60 ] && { echo "bench $2 $b: skipped (time)"; continue; }
        s=$SECONDS; timeout 100 $b bench -m "$1" -p 512,2048 -n 128 -r 3 > "$R/bench-$2-$b.txt" 2> "$R/bench-$2-$b.log"
        echo "bench $2 $b rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-$2-$b.txt" | head -4
    done
}
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
bench2 $m 26b-q8_0
pack
s=$SECONDS; timeout 45 gemtune bench -m $m -p 0 -n 32 -r 1 --profile-phases > "$R/phases-26b-q8_0.txt" 2>&1; echo "phases rc=$? $((SECONDS - s)) s"
pack
ab() {  # ab MODEL TAG
    [ "$(gpu_left)" -lt 100 ] && { echo "ab $2: skipped (time)"; return; }
    s=$SECONDS; timeout 150 gemtune ab --reps 6 --quiet --out "$R/ab-$2" --baseline main --candidate $P/fused-gelu.toml -m "$1" -p 512 -n 128 > "$R/ab-$2.txt" 2> "$R/ab-$2.log"
    echo "== ab $2 main vs fused-gelu: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$2.txt"; rm -f "$R"/ab-$2/worker-*.log "$R"/ab-$2/*.png
}
ab $m 26b-q8-fused-gelu
rm -f $m
pack
e=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $e > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
ab $e e4b-q8-fused-gelu
rm -f $e
pack
m=/tmp/26b-q4_k_m.gguf
if [ "$(gpu_left)" -gt 120 ]; then
    s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
    bench2 $m 26b-q4_k_m
    rm -f $m
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
