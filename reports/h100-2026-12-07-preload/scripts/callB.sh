#!/usr/bin/env bash
# GPU call B (one card, about 9 minutes: the session's last device time):
# PRELOAD in its final form (the chunks loaded before the wait are consumed
# by a peeled first round, the loop over the rest is PRELOAD=0's; PRELOAD=2
# also prefetches the next two rounds into L2) checked against the oracle on
# the gemv check shapes; `ab` of main (PRELOAD=1) and of preload2.toml
# (PRELOAD=2) against main-before.toml (PRELOAD=0) on E4B Q8_0; the parity
# suite on main; `ab` of main against main-before on 31B Q4_0; then, as time
# allows, the PRELOAD points timed beside main's at one token with chained
# launches. Stage first, here:
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu/bin .gpu/run.sh $(ls -d .gpu/tests/cuda_parity-*) \
#     | xz -9 -T2 > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] and
#   bash reports/h100-2026-12-07-preload/scripts/callB.sh
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 430
pack() { tar -C "$OUT" -czf "$OUT/callB.tgz" r; }
S=reports/h100-2026-12-07-preload/scripts
B=$S/main-before.toml
P2=$S/preload2.toml
PRE="--variant split-records-preload* --variant planes-fma-preload* --variant h100-dp4a-preload* --variant tail-records-records-preload"
BASE="--variant split-records --variant split-records+KSPLIT=1 --variant split-records+KSPLIT=4 --variant planes-fma+ROWS=2,WARPS=2 --variant planes-fma --variant h100-dp4a"
T="--budget-ms 25 --min-reps 20 --max-reps 100 --regime dram --no-reference --tokens 1"
mk() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync; }
# 1. The PRELOAD points against the oracle: the edge and k-quant check
#    shapes (partial super-blocks, n not a multiple of the block's rows).
gpu_check gemv 75 $PRE --shapes edge --shapes edge_ktypes --shapes edge_q6k --shapes decode_ktypes_check --tokens 1,8
pack
# 2. E4B Q8_0 decode tg128 after a 512-token prefill: PRELOAD 1 and 2.
mk e4b q8_0
gpu_ab e4b-q8-p1 "$B" main 60 10 /tmp/e4b-q8_0.gguf 512
gpu_ab e4b-q8-p2 "$B" "$P2" 60 10 /tmp/e4b-q8_0.gguf 512
pack
rm -f /tmp/e4b-q8_0.gguf
# 3. The parity suite on main (graph decode bit for bit against eager).
gpu_test cuda_parity 170
pack
# 4. 31B Q4_0.
s=$SECONDS; mk 31b q4_0; echo "synth 31b q4_0 $((SECONDS - s)) s"
gpu_ab 31b-q4-p1 "$B" main 120 6 /tmp/31b-q4_0.gguf 512
pack
rm -f /tmp/31b-q4_0.gguf
# 5. One token, dram, chained launches: main's points and the PRELOAD ones.
l=$(gpu_left)
if [ "$l" -ge 30 ]; then
  s=$SECONDS
  timeout $((l - 10)) gemtune tune gemv $T --launches chained --shapes decode --shapes decode_ktypes \
    --shape e4b.ffn --shape e4b_q4k --shape e4b_f16 --shape 31b_q4k $BASE $PRE \
    --out "$R/tune-chained" > "$R/tune-chained.txt" 2>&1
  echo "tune chained rc=$? $((SECONDS - s)) s"; rm -f "$R"/tune-chained/*.png "$R"/tune-chained/cells.jsonl
fi
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
