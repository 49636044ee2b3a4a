#!/usr/bin/env bash
# GPU call A (one H200; no H100 was lent this session): main as committed
# before this work (56d6b88), verified on the GPU for the first time (its
# records replay helpers, the parity suite), then benches and the graph
# decode phase tables of E4B Q8_0 and 31B Q4_0 (the "before" of the norm
# tail). Stage (../shared/tools/stage-gpu.sh), pack the needed executables
# into .gpubase/stage.tar.xz, then `run` with carry [".gpubase"], kind
# nvidia-h200, and
#   bash reports/h200-2026-11-28-norm-tail/scripts/callA.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 560
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
gpu_test cuda_parity 220
pack
gpu_check gemv 60 --variant split-records --variant gelu-side-records --shapes decode --shapes edge --tokens 1,3,8
pack
timeout 60 gemtune check moe_gemv --variant gate-up-split-records --variant down-records \
  --out /tmp/chk-moe > "$R/check-moe_gemv.txt" 2>&1; echo "check moe_gemv rc=$?"; tail -1 "$R/check-moe_gemv.txt"
cp /tmp/chk-moe/check.csv "$R/check-moe_gemv.csv" 2>/dev/null
pack
bench() {
  local v=$1 w=$2 to=$3
  [ "$(gpu_left)" -lt "$to" ] && { echo "bench $v $w: skipped (time)"; return; }
  local m=/tmp/$v-$w.gguf s=$SECONDS
  gemtune synth $v $w $m > /dev/null && sync
  timeout "$to" gemtune bench -m $m -p 512 -n 128 -r 3 > "$R/bench-$v-$w.txt" 2> "$R/bench-$v-$w.log"
  echo "bench $v $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-$v-$w.txt"
  if [ "$(gpu_left)" -ge 40 ]; then
    timeout 40 gemtune bench -m $m -p 0 -n 64 -r 1 --profile-phases > "$R/phases-$v-$w.txt" 2>&1
    echo "phases $v $w rc=$?"
  fi
  rm -f $m
  pack
}
bench e4b q8_0 60
bench 31b q4_0 80
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
