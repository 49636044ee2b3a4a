#!/usr/bin/env bash
# GPU call E (one H100, about 10 minutes): what the fourth 2026-11-26
# session's calls did not reach (reports/h100-2026-11-26-verify). Stage
# first (here): bash ../shared/tools/stage-gpu.sh, then pack gemtune and the
# cli_ab, cli_signals and gpu_moe test executables into .gpubase/stage.tar.xz
# (see reports/h100-2026-11-26-verify/scripts/callD.sh), and `run` with
# carry [".gpubase"] and `bash reports/pending-gpu-2026-11-26/callE.sh`.
set -u
cd "$(dirname "$0")/../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 570
# The staged suite's two long tests (issue 21), then the router test call C cut.
gpu_test cli_signals 200 tune_on_sigterm
gpu_test cli_ab 400 aa_on_the_gpu_is_same
gpu_test gpu_moe 150 moe_route_variants_pass
# E2B on equal work with llama.cpp (README table).
l=$(gpu_left); if [ "$l" -gt 70 ]; then
  gemtune synth e2b q8_0 /tmp/e2b-q8_0.gguf > /dev/null && sync
  timeout 60 gemtune bench -m /tmp/e2b-q8_0.gguf -p 512 -n 0 -r 3 --full-work > "$R/bench-e2b-full.txt" 2>&1
  timeout 60 gemtune bench -m /tmp/e2b-q8_0.gguf -p 2048 -n 0 -r 3 --full-work --ubatch 512 > "$R/bench-e2b-full-ub512.txt" 2>&1
  grep -hE "^\| gemma" "$R"/bench-e2b-*.txt
fi
tar -C "$OUT" -czf "$OUT/callE.tgz" r && rm -rf "$R"
echo "total $((SECONDS - GPU_CALL_T0)) s"
