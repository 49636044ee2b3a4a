#!/usr/bin/env bash
# GPU call B (one H200): the gemv sandwich-norm tail (TAIL=1) checked
# against the f64 chain on the check shapes at 1, 3 and 8 tokens; the
# parity suite with main (and strict, which inherits it) running the
# decode norms in the GEMV tails; then `ab` of norm-separate (the norms as
# launches, main before) against main on E4B Q8_0, 31B Q4_0 and E2B Q8_0.
# Stage as for call A, then `run` with carry [".gpubase"], kind
# nvidia-h200, and
#   bash reports/h200-2026-11-28-norm-tail/scripts/callB.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 570
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
gpu_check gemv 100 --variant 'tail-*' --shapes decode --shapes edge --tokens 1,3,8
pack
gpu_test cuda_parity 170
pack
# (at call time this file was variants/profiles/norm-separate.toml)
P=reports/h200-2026-11-28-norm-tail/scripts/norm-separate.toml
mk() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync; }
mk e4b q8_0
gpu_ab e4b-q8 "$P" main 100 10 /tmp/e4b-q8_0.gguf 512
pack
mk 31b q4_0
gpu_ab 31b-q4 "$P" main 130 5 /tmp/31b-q4_0.gguf 512
rm -f /tmp/31b-q4_0.gguf
pack
mk e2b q8_0
gpu_ab e2b-q8 "$P" main 70 10 /tmp/e2b-q8_0.gguf 512
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
