#!/usr/bin/env bash
# GPU call C (one H100): issue 28's per-type prefill GEMM figure. Call B's
# tune of the same shapes spent its time on the oracle checks of 512-row
# GEMMs (an f64 reference on the host per cell) and timed none; here the
# checks run at 64 rows (--check-max-m 64, the same kernels and tiles with
# partial row tiles) and the timings at 2048. Main's two wgmma GEMM forms
# (BM 256, 2 consumer warpgroups, 4 stages; split-K 2 for the down
# projections, `gemm.down`) on the FFN shapes of every type, dram regime,
# with the cuBLAS bf16 reference rows. Then, if time is left, every gemv
# variant at two k-quant shapes (m = 1, dram): larger spaces for the
# search-strategy replay (`gemtune search-replay`).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 140
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
G="--budget-ms 40 --min-reps 5 --max-reps 40 --regime dram --tokens 2048 --check-max-m 64"
s=$SECONDS; timeout $(( $(gpu_left) - 15 )) gemtune tune gemm_wgmma --shapes ffn_ktypes $G \
    --variant wide --variant split-k \
    --out "$R/tune-gemm-ktypes" > "$R/tune-gemm-ktypes.txt" 2>&1
echo "tune gemm ktypes rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemm-ktypes/*.png "$R"/tune-gemm-ktypes/cells.jsonl
pack
if [ "$(gpu_left)" -gt 30 ]; then
  T="--budget-ms 30 --min-reps 10 --max-reps 50 --regime dram --tokens 1 --no-reference"
  s=$SECONDS; timeout $(( $(gpu_left) - 8 )) gemtune tune gemv --shapes decode_ktypes --shape e4b_q4k.ffn_up --shape 31b_q4k.ffn_down $T \
      --out "$R/tune-gemv-all" > "$R/tune-gemv-all.txt" 2>&1
  echo "tune gemv all rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-gemv-all/*.png "$R"/tune-gemv-all/cells.jsonl
  pack
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
