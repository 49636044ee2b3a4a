#!/usr/bin/env bash
# GPU call A (one H100, about 9.5 minutes): what this session built without
# a GPU. moe_gemv PRELOAD=1 against the oracle (the two named variants
# beside the forms they extend), cuda_moe's chained tests (the new
# moe-preload bit-identity test among them), then on 26B-A4B Q8_0 `ab` of
# moe-chained.toml (main, step chained) against moe-preload (the same, the
# expert GEMVs' early work added), then main (MoE step in stream order)
# against moe-preload. Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-*) \
#     | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] and
#   bash reports/pending-gpu-2026-12-07/callA.sh
set -u
cd "$(dirname "$0")/../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
S=reports/pending-gpu-2026-12-07
P=variants/profiles/moe-preload.toml
# 1. The PRELOAD points and their PRELOAD=0 forms against the oracle.
gpu_check moe_gemv 100 --variant down-records-preload --variant gate-up-split-records-preload \
    --variant down-records --variant gate-up-split-records
pack
# 2. Chained decode bit for bit against plain, main and moe-preload.
gpu_test cuda_moe 130 chained
pack
# 3. 26B-A4B Q8_0, tg128 after a 512-token prefill.
s=$SECONDS
gemtune synth 26b-a4b q8_0 /tmp/26b-q8_0.gguf > /dev/null && sync
echo "synth 26b-a4b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-chained-preload "$S/moe-chained.toml" "$P" 170 8 /tmp/26b-q8_0.gguf 512
pack
gpu_ab 26b-main-preload main "$P" 150 6 /tmp/26b-q8_0.gguf 512
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
