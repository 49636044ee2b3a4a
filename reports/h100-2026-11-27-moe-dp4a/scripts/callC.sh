#!/usr/bin/env bash
# GPU call C (one H100): the split-Q8 expert GEMVs (moe_gemv ALGO 2) with
# the split written as ALGO 1 writes Q8_1 (8 lanes per 32-value group,
# split_write4) instead of a warp per group (call B). Tune of the split
# sweeps and main's previous FMA points at 26B-A4B's shapes (one token,
# dram), the MoE parity suite, `check` of the named split variants, `ab`
# of the previous expert GEMVs (`moe-fma`) against main on 26B-A4B Q8_0
# and Q4_K_M, and bench of both.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callC.tgz" r; }
T="--budget-ms 40 --min-reps 20 --max-reps 100 --regime dram --no-reference"
tune() {
  local name=$1 to=$2; shift 2
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune moe_gemv --tokens 1 $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png
  pack
}
tune q8 100 --shape moe_gemv.a4b_q8 --variant gate-up-split --variant 'gate-up-split+*' --variant down-split --variant 'down-split+*' --variant 'baseline+ROWS=2,UNROLL=2,WARPS=4' --variant 'down+ROWS=2,UNROLL=2,WARPS=4'
tune q4k 30 --shape moe_gemv.a4b_q4k --variant gate-up-split --variant 'gate-up-split+*' --variant gate-up-rows2
gpu_test cuda_moe 130
pack
m=/tmp/26b-q8_0.gguf
s=$SECONDS; gemtune synth 26b-a4b q8_0 $m > /dev/null && sync; echo "synth 26b q8_0 $((SECONDS - s)) s"
gpu_ab 26b-q8 variants/profiles/moe-fma.toml main 90 8 $m 512
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
gpu_ab 26b-q4km variants/profiles/moe-fma.toml main 80 8 $m 512
pack
bench q4_k_m $m 50
gpu_check moe_gemv 90 --variant gate-up-split --variant gate-up-split-count --variant down-split --variant down-split-count
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
