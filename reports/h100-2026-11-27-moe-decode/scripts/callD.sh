#!/usr/bin/env bash
# GPU call D (one H100): the final state of this session's changes. In
# order: the engine's MoE parity tests and the dense parity suite (the
# PRMT conversions in every Q8_0 / Q4_0 FMA GEMV, the MoE norms on the
# dense launches, moe_gemm.down); the MoE kernel tests (moe_gemm's chain
# and variants with the SMEM_DQ paths, moe_gemv with the new DOWN walk);
# `check gemv` on the FMA variants' named points; 26B-A4B Q8_0 and Q4_K_M
# bench; `ab` of main's grouped down stage (one warp row) against the 2 x 4
# layout (down-2x4.toml) on 26B-A4B Q8_0 at pp2048. Stage first (release
# gemtune and the three test executables), `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
P=reports/h100-2026-11-27-moe-decode/scripts
gpu_test cuda_moe 80
pack
gpu_test cuda_parity 120
pack
gpu_test gpu_moe 110
pack
gpu_check gemv 50 --variant planes-fma --variant fused-gate-up --variant xsmem-fma --variant baseline
pack
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
s=$SECONDS; timeout 60 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q8_0.txt" 2> "$R/bench-26b-q8_0.log"
echo "bench 26b q8_0 rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q8_0.txt" | head -4
pack
if [ "$(gpu_left)" -gt 70 ]; then
    s=$SECONDS; timeout 70 gemtune ab --reps 6 --quiet --out "$R/ab-26b-q8-down" --baseline $P/down-2x4.toml --candidate main -m $m -p 2048 -n 16 > "$R/ab-26b-q8-down.txt" 2> "$R/ab-26b-q8-down.log"
    echo "== ab 26b q8_0 down-2x4 vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-26b-q8-down.txt"; rm -f "$R"/ab-26b-q8-down/worker-*.log "$R"/ab-26b-q8-down/*.png
fi
rm -f $m
pack
m=/tmp/26b-q4_k_m.gguf
if [ "$(gpu_left)" -gt 60 ]; then
    s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
    s=$SECONDS; timeout 50 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-q4_k_m.txt" 2> "$R/bench-26b-q4_k_m.log"
    echo "bench 26b q4_k_m rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-q4_k_m.txt" | head -4
    rm -f $m
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
