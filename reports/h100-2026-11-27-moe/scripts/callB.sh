#!/usr/bin/env bash
# GPU call B (one H100): the MoE tests after the Q4_0 `main` test was split
# from main's bar (routing sensitivity), the parity suite with main's Q6_K
# tied head on its plane repack shared with the gather (embed LAYOUT=1,
# issue 28's device-memory bar: main within 1.05x of the file on every
# native type), the expert kernels tuned at 26B-A4B's decode shapes, and
# E4B Q4_K_M: `ab` of q8-head (the converted head beside the table) against
# main, bench and device memory. Stage first, pack gemtune and the test
# executables into .gpubase/stage.tar.xz, `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 590
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
gpu_test cuda_moe 120
pack
gpu_test cuda_parity 170
pack
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
s=$SECONDS; timeout 120 gemtune tune moe_gemv --shape moe_gemv.a4b_q8 --tokens 1,8 $T --out "$R/tune-moe_gemv" > "$R/tune-moe_gemv.txt" 2>&1
echo "tune moe_gemv rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_gemv/*.png; tail -4 "$R/tune-moe_gemv.txt"
pack
s=$SECONDS; timeout 50 gemtune tune moe_route --shape moe_route.a4b --tokens 1,8 $T --out "$R/tune-moe_route" > "$R/tune-moe_route.txt" 2>&1
echo "tune moe_route rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-moe_route/*.png; tail -4 "$R/tune-moe_route.txt"
pack
gemtune synth e4b q4_k_m /tmp/e4b-q4km.gguf > /dev/null && sync
timeout 40 gemtune run -v -m /tmp/e4b-q4km.gguf -p "hello" -n 2 > "$R/run-v-e4b-q4km.txt" 2>&1
grep -iE "device memory|lossy|gemv.head|embed" "$R/run-v-e4b-q4km.txt" | head -6
s=$SECONDS; timeout 100 gemtune ab --reps 8 --quiet --out "$R/ab-e4b-q4km-head" --baseline q8-head --candidate main -m /tmp/e4b-q4km.gguf -p 512 -n 128 > "$R/ab-e4b-q4km-head.txt" 2> "$R/ab-e4b-q4km-head.log"
echo "== ab e4b q4_k_m q8-head vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-q4km-head.txt"; rm -f "$R"/ab-e4b-q4km-head/worker-*.log
pack
[ "$(gpu_left)" -gt 60 ] && { s=$SECONDS; timeout $(( $(gpu_left) - 15 )) gemtune bench -m /tmp/e4b-q4km.gguf -p 512,2048 -n 128 -r 3 > "$R/bench-e4b-q4km.txt" 2> "$R/bench-e4b-q4km.log"; echo "bench e4b q4_k_m rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma|lossy" "$R/bench-e4b-q4km.txt" | head -6; }
rm -f /tmp/e4b-q4km.gguf
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
