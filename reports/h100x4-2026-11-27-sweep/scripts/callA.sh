#!/usr/bin/env bash
# One nvidia-h100-x4 call (carry [".gpubase"]): issue 25's multi-GPU figures.
# 1. the cubin cache warmed by a compile-only check of attn_decode;
# 2. the same attn_decode sweep (its spec's shapes, dram regime, 100 ms per
#    cell) on 1, 2 and 4 GPUs, wall time of each;
# 3. the GPU tests of the worker pool and the search strategies.
set -u
tar -C . -xJf .gpubase/stage.tar.xz
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
nvidia-smi -L > "$R/gpus.txt"
nvidia-smi topo -m >> "$R/gpus.txt" 2>&1
s=$SECONDS
gemtune check attn_decode --compile-only --arch sm_90 --out /tmp/warm > "$R/warm.txt" 2>&1
echo "warm rc=$? $((SECONDS - s))s" | tee -a "$R/walls.txt"
for dev in 0 0,1 0,1,2,3; do
    n=$(echo "$dev" | tr ',' '\n' | wc -l)
    [ "$(gpu_left)" -lt 150 ] && { echo "tune on $n GPUs: skipped (time)" | tee -a "$R/walls.txt"; continue; }
    s=$SECONDS
    timeout $(( $(gpu_left) - 120 )) gemtune tune attn_decode --regime dram --budget-ms 100 \
        --devices "$dev" --out "/tmp/attn-$n" > "$R/tune-$n.txt" 2>&1
    echo "tune attn_decode on $n GPUs ($dev): rc=$? wall $((SECONDS - s)) s" | tee -a "$R/walls.txt"
    mkdir -p "$R/attn-$n"
    cp /tmp/attn-$n/results.csv /tmp/attn-$n/summary.md /tmp/attn-$n/run.json "$R/attn-$n/" 2>/dev/null
    pack
done
gpu_test cli_sweep 200
pack
gpu_test cli_tune_search 100
pack
