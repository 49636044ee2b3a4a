#!/usr/bin/env bash
# GPU call H (one H100): `check moe_gemv` of the split DOWN variants on
# the small shapes (tiny-moe: 6 chunks per expert row against 32 lanes,
# tokens sharing experts, Q4_0) and the 26B-A4B shape at 8 tokens.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 280
pack() { tar -C "$OUT" -czf "$OUT/callH.tgz" r; }
gpu_check moe_gemv 200 --variants-dir .gpubase/variants --variant down-ksplit2 --variant down-ksplit2-count --variant down-ksplit4 --variant 'down-ksplit2+KSPLIT=8,ROWS=1,UNROLL=1,WARPS=8' --variant 'down-ksplit2+KSPLIT=2,ROWS=4,UNROLL=1,WARPS=8' --shape moe_gemv.tiny --shape moe_gemv.tiny_q4 --shape moe_gemv.a4b_q8 --shape moe_gemv.a4b_q4
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
