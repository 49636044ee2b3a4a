#!/usr/bin/env bash
# GPU call A (one H100): the MoE decode changes before any timing of the
# model. In order: `check rmsnorm` (the sandwich norm's MoE modes SUM_IN
# and OUTS=3 against the f64 oracle, every other mode unchanged); `check
# moe_gemv` (GATE_UP with UNROLL chunks in flight, DOWN walking the
# (expert, chunk) units as one stream); `tune moe_gemv` at 26B-A4B's
# decode shape, one token (Q8_0 both stages, Q4_K gate/up); the engine's
# MoE parity tests (the norms now ride on the attention residual and the
# layer end) and the dense parity suite (every rmsnorm launch gained
# arguments). Stage first (release gemtune + the two test executables
# packed into .gpubase/stage.tar.xz), `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
gpu_check rmsnorm 70
pack
gpu_check moe_gemv 110
pack
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
s=$SECONDS; timeout 80 gemtune tune moe_gemv --shape moe_gemv.a4b_q8 --tokens 1 $T --out "$R/tune-moe_gemv-q8" > "$R/tune-moe_gemv-q8.txt" 2>&1
echo "tune moe_gemv q8 rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv-q8/*.png
pack
s=$SECONDS; timeout 40 gemtune tune moe_gemv --shape moe_gemv.a4b_q4k --tokens 1 --variant 'baseline*' --variant 'gate-up*' $T --out "$R/tune-moe_gemv-q4k" > "$R/tune-moe_gemv-q4k.txt" 2>&1
echo "tune moe_gemv q4k rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv-q4k/*.png
pack
gpu_test cuda_moe 130
pack
gpu_test cuda_parity 150
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
