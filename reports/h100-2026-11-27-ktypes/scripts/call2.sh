#!/usr/bin/env bash
# GPU call 2 (one H100, chained on call 1's machine): the staged suite's two
# long tests that no GPU call had seen finish (issue 21), the router test,
# and E2B Q8_0 on equal work with llama.cpp (README table).
set -u
cd "$(dirname "$0")/../../.."
[ -x .gpu/bin/gemtune ] || tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 580
gpu_test cli_signals 200 tune_on_sigterm
gpu_test cli_ab 420 aa_on_the_gpu_is_same
gpu_test gpu_moe 100 moe_route_variants_pass
if [ "$(gpu_left)" -gt 60 ]; then
  gemtune synth e2b q8_0 /tmp/e2b-q8_0.gguf > /dev/null && sync
  timeout 40 gemtune bench -m /tmp/e2b-q8_0.gguf -p 512 -n 0 -r 3 --full-work > "$R/bench-e2b-full.txt" 2>&1
  timeout 40 gemtune bench -m /tmp/e2b-q8_0.gguf -p 2048 -n 0 -r 3 --full-work --ubatch 512 > "$R/bench-e2b-full-ub512.txt" 2>&1
  grep -hE "^\| gemma" "$R"/bench-e2b-*.txt
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
