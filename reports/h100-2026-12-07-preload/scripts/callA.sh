#!/usr/bin/env bash
# GPU call A (one H100, about 9.5 minutes): the decode GEMV with PRELOAD=1
# (a lane's first weight chunks loaded before the chained launch's wait)
# checked against the oracle, timed beside its PRELOAD=0 twins at one token
# in the stream and chained launch modes, then `ab` of main (PRELOAD=1 on
# every decode GEMV slot) against main-before (PRELOAD=0) on E4B Q8_0,
# 31B Q4_0 and E4B Q4_K_M. Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_parity-*) \
#     | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] (asked as nvidia-h200; it ran on an H100), and
#   bash reports/h100-2026-12-07-preload/scripts/callA.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 570
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
B=reports/h100-2026-12-07-preload/scripts/main-before.toml
CHECK="--variant split-records-preload* --variant planes-fma-preload* --variant h100-dp4a-preload --variant tail-records-records-preload"
PAIRS="--variant split-records --variant split-records+KSPLIT=1 --variant split-records-preload* --variant planes-fma --variant planes-fma-preload* --variant h100-dp4a --variant h100-dp4a-preload"
T="--budget-ms 30 --min-reps 20 --max-reps 100 --regime dram --no-reference --tokens 1"
tune() {
  local name=$1 to=$2; shift 2
  [ "$(gpu_left)" -lt "$to" ] && { echo "tune $name: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$to" gemtune tune gemv $T "$@" --out "$R/tune-$name" > "$R/tune-$name.txt" 2>&1
  echo "tune $name rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-"$name"/*.png "$R"/tune-"$name"/cells.jsonl
  pack
}
mk() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync; }
# 1. The PRELOAD points against the oracle (every gemv check shape).
gpu_check gemv 100 $CHECK
pack
# 2. One token, dram: main's points and their PRELOAD twins, chained then
#    stream (the stream mode cannot overlap launches: the twins should tie).
tune chained 110 --launches chained --shapes decode --shapes decode_ktypes \
  --shape e4b. --shape e4b_q4.ffn_up --shape e4b_q4k --shape e4b_f16 --shape 31b_ $PAIRS
tune stream 60 --launches stream --shapes decode --shapes decode_ktypes \
  --shape e4b.ffn --shape e4b_q4k --shape 31b_q4k $PAIRS
# 3. End to end: main (PRELOAD=1) against main-before, decode tg128 after
#    a 512-token prefill.
mk e4b q8_0
gpu_ab e4b-q8 "$B" main 90 10 /tmp/e4b-q8_0.gguf 512
pack
mk e4b q4_k_m
gpu_ab e4b-q4km "$B" main 80 8 /tmp/e4b-q4_k_m.gguf 512
pack
rm -f /tmp/e4b-*.gguf
mk 31b q4_0
gpu_ab 31b-q4 "$B" main 120 5 /tmp/31b-q4_0.gguf 512
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
