#!/usr/bin/env bash
# GPU call C (one H100): the records epilogue shared by gemv and moe_gemv
# (split_store_rows, q8_split.cuh) checked again after the refactor, the
# MoE family's GPU tests, and benches of main as committed. Stage first, as
# for call B, then `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-moe-records/scripts/callC.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 540
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
S=reports/h100-2026-11-28-moe-records/scripts
gpu_check gemv 60 --variant fused-records --variant split-records --variant gelu-side-records \
  --shapes decode --shapes edge --shapes $S/ple.toml --tokens 1,3,8
pack
timeout 60 gemtune check moe_gemv --variant gate-up-split-records --variant gate-up-split-records-count \
  --variant gate-up-records --variant down-records --variant down-records-count \
  --out /tmp/chk-moe > "$R/check-moe_gemv.txt" 2>&1; echo "check moe_gemv rc=$?"; tail -1 "$R/check-moe_gemv.txt"
cp /tmp/chk-moe/check.csv "$R/check-moe_gemv.csv" 2>/dev/null
pack
gpu_test gpu_moe 200
pack
bench() {
  local v=$1 w=$2 to=$3
  [ "$(gpu_left)" -lt "$to" ] && { echo "bench $v $w: skipped (time)"; return; }
  local m=/tmp/$v-$w.gguf s=$SECONDS
  gemtune synth $v $w $m > /dev/null && sync
  timeout "$to" gemtune bench -m $m -p 512 -n 128 -r 3 > "$R/bench-$v-$w.txt" 2> "$R/bench-$v-$w.log"
  echo "bench $v $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-$v-$w.txt"
  rm -f $m
  pack
}
bench e4b q8_0 50
bench e2b q8_0 40
bench 31b q4_0 70
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
