#!/usr/bin/env bash
# GPU call B (one H100, about 10 minutes): the PLE gate GEMV multiplying its
# own gelu by the per-layer input (gemv FUSE=2, main's ple_gelu = "fused"),
# the parity suite over main as it now stands (MoE down on records, PLE
# fused), and the MoE records on 26B-A4B Q4_K_M. Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_moe-* .gpu/tests/gpu_moe-* \
#     .gpu/tests/cuda_parity-* .gpu/tests/gpu_families-*) | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-moe-records/scripts/callB.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
S=reports/h100-2026-11-28-moe-records/scripts
# 1. FUSE=2 against the oracle: the PLE shapes, partial tiles, 1-8 tokens,
#    f32 and records output.
gpu_check gemv 60 --variant gelu-side --variant gelu-side-records --shapes $S/ple.toml \
  --shapes decode --shapes edge --shape edge. --shape e4b.ple --shape e2b.ple --shape e4b_q4.ple \
  --shape e4b.attn_k --tokens 1,3,5,7,8
pack
# 2. The parity suite on main (PLE fused, MoE down on records).
gpu_test cuda_parity 200
pack
# 3. End to end: E4B and E2B Q8_0, the PLE gelu fused against its launch.
for v in e4b e2b; do
  m=/tmp/$v-q8_0.gguf
  s=$SECONDS; gemtune synth $v q8_0 $m > /dev/null && sync; echo "synth $v q8_0 $((SECONDS - s)) s"
  gpu_ab $v-ple variants/profiles/ple-separate.toml main 85 12 $m 512
  pack
  rm -f $m
done
# 4. 26B-A4B Q4_K_M: the MoE records (gate|up at 32 rows a block writing
#    them, down reading them) against both stages splitting per block.
m=/tmp/26b-q4km.gguf
s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
gpu_ab 26b-q4km-moe variants/profiles/moe-split.toml main 80 8 $m 512
rm -f $m
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
