#!/usr/bin/env bash
# GPU call C (one H200): the tail after call B (per-block partial sums of
# squares, batched loads) checked again; then `ab` on E4B Q8_0 of main
# (norms as launches) against norm-tail (the norms in the GEMV tails, 8-warp
# blocks), of norm-tail-separate (the same blocks, norms as launches)
# against norm-tail (the tail alone), then main against norm-tail on 31B
# Q4_0 and E2B Q8_0; last the parity suite on this tree. Stage as for call
# A, then `run` with carry [".gpubase"], kind nvidia-h200, and
#   bash reports/h200-2026-11-28-norm-tail/scripts/callC.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
gpu_check gemv 80 --variant 'tail-*' --shapes decode --tokens 1,3,8
pack
mk() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync; }
S=variants/profiles/norm-tail-separate.toml
mk e4b q8_0
gpu_ab e4b-main-tail main norm-tail 60 10 /tmp/e4b-q8_0.gguf 512
pack
gpu_ab e4b-sep-tail "$S" norm-tail 60 10 /tmp/e4b-q8_0.gguf 512
pack
rm -f /tmp/e4b-q8_0.gguf
mk 31b q4_0
gpu_ab 31b-main-tail main norm-tail 120 6 /tmp/31b-q4_0.gguf 512
rm -f /tmp/31b-q4_0.gguf
pack
mk e2b q8_0
gpu_ab e2b-main-tail main norm-tail 50 10 /tmp/e2b-q8_0.gguf 512
rm -f /tmp/e2b-q8_0.gguf
pack
gpu_test cuda_parity 170
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
