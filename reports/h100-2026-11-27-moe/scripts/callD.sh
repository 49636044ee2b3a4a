#!/usr/bin/env bash
# GPU call D (one H100): the MoE parity tests with main's bar stated per
# weight type (Q4_0's dp4a arithmetic apart), the expert GEMV kernel tests
# to completion (the new DOWN), and `ab` of the two MoE prefill paths on
# 26B-A4B Q8_0: the expert GEMVs on groups of 8 rows (moe-groups.toml)
# against main's grouped GEMMs. Stage first, pack gemtune and the test
# executables into .gpubase/stage.tar.xz, `run` with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 400
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
gpu_test cuda_moe 90
pack
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
s=$SECONDS; timeout 150 gemtune ab --reps 6 --quiet --out "$R/ab-26b-q8-moe" --baseline reports/h100-2026-11-27-moe/scripts/moe-groups.toml --candidate main -m $m -p 512 -n 64 > "$R/ab-26b-q8-moe.txt" 2> "$R/ab-26b-q8-moe.log"
echo "== ab 26b q8_0 moe-groups vs main: exit $? in $((SECONDS - s)) s"; cat "$R/ab-26b-q8-moe.txt"; rm -f "$R"/ab-26b-q8-moe/worker-*.log "$R"/ab-26b-q8-moe/*.png
rm -f $m
pack
gpu_test gpu_moe 150 moe_gemv
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
