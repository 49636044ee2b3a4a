#!/usr/bin/env bash
# GPU call C (one H100): the Q8_0 / Q4_0 FMA chunk products without I2F
# (PRMT + FADD; the same values), and moe_gemm's shared-tile operand paths
# (SMEM_DQ). In order: `check gemv` on the FMA variants and `check
# moe_gemm` on the new SMEM_DQ variants; `tune gemv` at E4B's FFN shapes
# (one token) with this binary and with the previous main's
# (gemtune-prev, 0df515c: I2F conversions); `tune moe_gemv` at 26B-A4B's
# decode shape; `tune moe_gemm` at 26B-A4B pp2048 (Q8_0); then bench of
# 26B-A4B Q8_0 and of E4B Q8_0 with both binaries. Stage first (release
# gemtune and gemtune-prev), `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
gpu_check gemv 70 --variant 'planes-fma*' --variant baseline --variant fused-gate-up --variant 'xsmem-fma*' --tokens 1,3,8
pack
gpu_check moe_gemm 70 --variant 'gate-up-sdq*' --variant 'down-sdq*'
pack
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
for b in gemtune gemtune-prev; do
    s=$SECONDS; timeout 50 $b tune gemv --shape e4b.ffn_up --shape e4b.ffn_down --tokens 1 --variant 'planes-fma*' --variant 'h100-dp4a' $T --out "$R/tune-gemv-$b" > "$R/tune-gemv-$b.txt" 2>&1
    echo "tune gemv $b rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemv-$b/*.png
done
pack
s=$SECONDS; timeout 40 gemtune tune moe_gemv --shape moe_gemv.a4b_q8 --tokens 1 $T --out "$R/tune-moe_gemv-q8" > "$R/tune-moe_gemv-q8.txt" 2>&1
echo "tune moe_gemv rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv-q8/*.png
pack
s=$SECONDS; timeout 130 gemtune tune moe_gemm --shapes moe_prefill_tune.toml --shape moe_gemm.a4b_q8 --tokens 2048 --variant baseline --variant down --variant 'down-warp64' --variant 'gate-up-sdq*' --variant 'down-sdq*' $T --out "$R/tune-moe_gemm-q8" > "$R/tune-moe_gemm-q8.txt" 2>&1
echo "tune moe_gemm rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemm-q8/*.png
pack
bench2() {  # bench2 MODEL TAG ARGS: this main, then the previous one
    local m=$1 tag=$2; shift 2
    for b in gemtune gemtune-prev; do
        [ "$(gpu_left)" -lt 50 ] && { echo "bench $tag $b: skipped (time)"; continue; }
        s=$SECONDS; timeout 80 $b bench -m "$m" "$@" > "$R/bench-$tag-$b.txt" 2> "$R/bench-$tag-$b.log"
        echo "bench $tag $b rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-$tag-$b.txt" | head -4
    done
}
e=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $e > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
bench2 $e e4b-q8_0 -p 512 -n 128 -r 3
rm -f $e
pack
m=/tmp/26b-q8_0.gguf
if [ "$(gpu_left)" -gt 80 ]; then
    s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
    s=$SECONDS; timeout 60 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0.txt" 2> "$R/bench-26b-q8_0.log"
    echo "bench 26b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0.txt" | head -4
    rm -f $m
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
