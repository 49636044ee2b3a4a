#!/usr/bin/env bash
# The third nvidia-h100-x4 call (carry [".gpubase"]): issue 25's scaling
# figure with per-cell work that outweighs the fixed start of a run.
# callA2.sh's 238 cells took 21 s on one GPU: the default 200-sample cap
# stops a 10 us kernel after 2 ms, so each cell was mostly its check and
# set-up, and the run's few seconds of start (workers, device probes) bound
# the 2- and 4-GPU times. Here every cell samples for its 300 ms budget
# (up to 100,000 samples): e4b.swa_dec at 1, 3 and 8 tokens (357 cells,
# every variant), dram regime, on 1, 2 and 4 GPUs.
set -u
tar -C . -xJf .gpubase/stage.tar.xz
. scripts/gpu-call.sh 575
pack() { tar -C "$OUT" -czf "$OUT/callA3.tgz" r; }
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
    timeout "$cap" gemtune tune attn_decode --regime dram --budget-ms 300 --min-reps 20 --max-reps 100000 --shape e4b.swa_dec \
        --devices "$dev" --out "/tmp/attn-$n" > "$R/tune-$n.txt" 2>&1
    echo "tune attn_decode on $n GPUs ($dev): rc=$? wall $((SECONDS - s)) s" | tee -a "$R/walls.txt"
    mkdir -p "$R/attn-$n"
    cp /tmp/attn-$n/results.csv /tmp/attn-$n/summary.md /tmp/attn-$n/run.json "$R/attn-$n/" 2>/dev/null
    pack
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
