#!/usr/bin/env bash
# GPU call A (one H100): the dp4a expert GEMVs (moe_gemv ALGO 1). The MoE
# parity suite (main now runs the experts on ALGO 1, strict on ALGO 0),
# `check` of the named dp4a variants on every moe_gemv check shape, a tune
# of the dp4a sweeps against main's previous FMA points at 26B-A4B's
# shapes (one token, dram), `ab` of the previous arithmetic (`moe-fma`)
# against main on 26B-A4B Q8_0, and bench of 26B-A4B Q8_0 and Q4_K_M.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
gpu_test cuda_moe 100
pack
gpu_check moe_gemv 60 --variant gate-up-dp4a --variant gate-up-dp4a-count --variant down-dp4a --variant down-dp4a-count
pack
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
tune() {
  local name=$1 to=$2; shift 2
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune moe_gemv --tokens 1 $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png
  pack
}
tune q8 150 --shape moe_gemv.a4b_q8 --variant 'gate-up-dp4a+*' --variant 'down-dp4a+*' --variant 'baseline+ROWS=2,UNROLL=2,WARPS=4' --variant 'down+ROWS=2,UNROLL=2,WARPS=4'
tune q4k 40 --shape moe_gemv.a4b_q4k --variant 'gate-up-dp4a+*' --variant 'gate-up-rows2'
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-q8 variants/profiles/moe-fma.toml main 100 10 $m 512
pack
bench() {
  local w=$1 m=$2 to=$3
  [ "$(gpu_left)" -lt "$to" ] && { echo "bench $w: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-$w.txt" 2> "$R/bench-26b-$w.log"
  echo "bench 26b $w rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-26b-$w.txt"
  pack
}
bench q8_0 $m 60
rm -f $m
m=/tmp/26b-q4km.gguf
s=$SECONDS; gemtune synth 26b-a4b q4_k_m $m > /dev/null && sync; echo "synth 26b q4_k_m $((SECONDS - s)) s"
bench q4_k_m $m 60
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
