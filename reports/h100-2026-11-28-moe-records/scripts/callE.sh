#!/usr/bin/env bash
# GPU call E (one H100, short): benches of main as committed for the
# targets call C did not cover: 12B Q4_0 and E4B Q4_K_M. Same stage as
# call C; `run` with carry [".gpubase"], kind nvidia-h100-x1, and
#   bash reports/h100-2026-11-28-moe-records/scripts/callE.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 180
pack() { tar -C "$OUT" -czf "$OUT/callE.tgz" r; }
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
bench 12b q4_0 60
bench e4b q4_k_m 45
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
