#!/usr/bin/env bash
# The fourth nvidia-h100-x4 call (carry [".gpubase"]): issue 25's scaling
# figure at a fixed amount of GPU work per cell. callA3.sh's --max-reps
# 100000 let the adaptive sampler take a different number of samples per
# cell in each run (on 2 and 4 GPUs 2.5x and 2.2x the samples of one GPU
# on average, the medians within 1 %), so its runs did different work.
# Here every cell takes exactly 400 samples (each of 91 launches over
# rotated copies in the dram regime): e4b.swa_dec at 1, 3 and 8 tokens,
# every variant but the three scalar `baseline` cells (77 ms a sample),
# 354 cells, on 1, 2 and 4 GPUs.
set -u
tar -C . -xJf .gpubase/stage.tar.xz
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callA4.tgz" r; }
nvidia-smi -L > "$R/gpus.txt"
nvidia-smi topo -m >> "$R/gpus.txt" 2>&1
s=$SECONDS
gemtune check attn_decode --compile-only --arch sm_90 --out /tmp/warm > "$R/warm.txt" 2>&1
echo "warm rc=$? $((SECONDS - s))s" | tee -a "$R/walls.txt"
# At most 230, 130 and 80 s: about 0.4 s a cell on one GPU.
for run in 0:230 0,1:130 0,1,2,3:80; do
    dev=${run%%:*} cap=${run##*:}
    n=$(echo "$dev" | tr ',' '\n' | wc -l)
    left=$(( $(gpu_left) - 15 ))
    [ "$left" -lt 40 ] && { echo "tune on $n GPUs: skipped (time)" | tee -a "$R/walls.txt"; continue; }
    [ "$cap" -gt "$left" ] && cap=$left
    s=$SECONDS
    timeout "$cap" gemtune tune attn_decode --regime dram --budget-ms 100000 --min-reps 400 --max-reps 400 --shape e4b.swa_dec --variant 'keymajor*' --variant 'split*' --variant 'stream*' \
        --devices "$dev" --out "/tmp/attn-$n" > "$R/tune-$n.txt" 2>&1
    echo "tune attn_decode on $n GPUs ($dev): rc=$? wall $((SECONDS - s)) s" | tee -a "$R/walls.txt"
    mkdir -p "$R/attn-$n"
    cp /tmp/attn-$n/results.csv /tmp/attn-$n/summary.md /tmp/attn-$n/run.json "$R/attn-$n/" 2>/dev/null
    pack
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
