#!/usr/bin/env bash
# The second nvidia-h100-x4 call (carry [".gpubase"]): issue 25's scaling
# figure. callA.sh's sweep over attn_decode's 23 default shapes (1,151
# cells) did not finish on one GPU in 453 s, so this one sweeps two shapes
# (e4b.swa_dec at 1 and 8 tokens: 238 cells, every variant) in the dram
# regime at 50 ms per cell, on 1, 2 and 4 GPUs, after warming the cubin
# cache.
set -u
tar -C . -xJf .gpubase/stage.tar.xz
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callA2.tgz" r; }
nvidia-smi -L > "$R/gpus.txt"
nvidia-smi topo -m >> "$R/gpus.txt" 2>&1
s=$SECONDS
gemtune check attn_decode --compile-only --arch sm_90 --out /tmp/warm > "$R/warm.txt" 2>&1
echo "warm rc=$? $((SECONDS - s))s" | tee -a "$R/walls.txt"
# At most 300, 170 and 110 s: about 0.6 s a cell on one GPU.
for run in 0:300 0,1:170 0,1,2,3:110; do
    dev=${run%%:*} cap=${run##*:}
    n=$(echo "$dev" | tr ',' '\n' | wc -l)
    left=$(( $(gpu_left) - 15 ))
    [ "$left" -lt 40 ] && { echo "tune on $n GPUs: skipped (time)" | tee -a "$R/walls.txt"; continue; }
    [ "$cap" -gt "$left" ] && cap=$left
    s=$SECONDS
    timeout "$cap" gemtune tune attn_decode --regime dram --budget-ms 50 --shape e4b.swa_dec --tokens 1,8 \
        --devices "$dev" --out "/tmp/attn-$n" > "$R/tune-$n.txt" 2>&1
    echo "tune attn_decode on $n GPUs ($dev): rc=$? wall $((SECONDS - s)) s" | tee -a "$R/walls.txt"
    mkdir -p "$R/attn-$n"
    cp /tmp/attn-$n/results.csv /tmp/attn-$n/summary.md /tmp/attn-$n/run.json "$R/attn-$n/" 2>/dev/null
    pack
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
