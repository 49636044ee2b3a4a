#!/usr/bin/env bash
# Runs the kernel harness on a GPU host: correctness check, then the tuning
# sweeps behind the issue's figures. Each phase writes one compact report
# directory (at most 7 files: check.csv, results.csv, summary.md, PNGs) under
# OUT_ROOT, so a phase's results fit a transfer of 8 files.
#
# usage: scripts/gpu-tune.sh OUT_ROOT [check|gemv|prefill|prefill-more|attn|attn-prefill|attn-decode|rows|all]
#   check         gemtune check over every family (GPU), a shape subset that keeps the oracle fast
#   gemv          tune gemv on E4B decode shapes, 1/2/4/8 tokens, l2 and dram
#   prefill       tune mmq,gemm_dq side by side on E4B FFN shapes at N = 2048 (+512, 4096)
#   prefill-more  the same on the 12B Q4_0 FFN and E4B attention projections at N = 2048
#   attn          tune attn_prefill (l2) and attn_decode (dram) on attn.toml: the
#                 prefill figures at 4096 tokens (hd 256 / 512 causal, window 512),
#                 12B/31B heads, chunked and partial-tile cases; decode over 16K keys
#                 (attn-prefill / attn-decode: one of the two, for one 10-minute slot each)
#   rows          tune the row-wise families on elementwise_tune.toml (dram)
#   all           every phase above (needs more than one 10-minute slot)
# Environment: GEMTUNE (binary; default cargo's release build, found by
# scripts/gemtune-bin.sh),
# GEMTUNE_BUDGET_MS (timing budget per cell, default 150).
set -euo pipefail

out_root=${1:?usage: scripts/gpu-tune.sh OUT_ROOT [check|gemv|prefill|prefill-more|attn|attn-prefill|attn-decode|rows|all]}
phase=${2:-all}
cd "$(dirname "$0")/.."

# NVRTC and cuBLAS from the pip wheels (nvidia-cuda-nvrtc, nvidia-cublas) when
# present. Each wheel installs into nvidia/cu13/lib of its own site-packages,
# which may differ (user and system installs), so every such directory goes on
# LD_LIBRARY_PATH. A CUDA toolkit's libraries on the default search path work
# as well.
if py_libs=$(python3 -c 'import nvidia, os; print(":".join(d for d in (os.path.join(p, "cu13", "lib") for p in nvidia.__path__) if os.path.isdir(d)))' 2>/dev/null) \
    && [[ -n "$py_libs" ]]; then
    export LD_LIBRARY_PATH="$py_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The vendor reference rows of `tune` (cuBLAS bf16 / int8 GEMM) need
# libcublas.so.13; without it they are reported as unavailable, not run.
if ! python3 -c 'import ctypes; ctypes.CDLL("libcublas.so.13")' 2>/dev/null; then
    echo "gpu-tune: libcublas.so.13 not found (pip install nvidia-cublas): reference rows will say 'unavailable'" >&2
fi

bin=$(scripts/gemtune-bin.sh --release)
budget=${GEMTUNE_BUDGET_MS:-150}
tune=("$bin" tune --budget-ms "$budget" --min-reps 10 --max-reps 100 --check-max-m 128)

mkdir -p "$out_root"
status=0
run_phase() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    "$@" || { rc=$?; echo "== $name exited $rc" >&2; status=$rc; }
}

case $phase in
check | all)
    run_phase check "$bin" check --out "$out_root/check" \
        --tokens 1,3,7,8,113 --shape e4b.ffn_up --shape e4b.attn_k --shape 12b.ffn_up --shape edge.
    ;;&
gemv | all)
    run_phase gemv "${tune[@]}" gemv --shapes decode.toml --regime both \
        --shape e4b.ffn_up --shape e4b.ffn_down --shape e4b.attn_q --tokens 1,2,4,8 \
        --out "$out_root/gemv"
    ;;&
prefill | all)
    run_phase prefill "${tune[@]}" mmq,gemm_dq --shapes ffn.toml --regime both \
        --shape e4b.ffn_up --shape e4b.ffn_down --tokens 512,2048,4096 \
        --out "$out_root/prefill"
    ;;&
prefill-more | all)
    run_phase prefill-more "${tune[@]}" mmq,gemm_dq --shapes ffn.toml --shapes attn_proj.toml --regime both \
        --shape 12b.ffn_up --shape 12b.ffn_down --shape e4b.attn_q --shape e4b.attn_output --tokens 2048 \
        --out "$out_root/prefill-more"
    ;;&
attn | attn-prefill | all)
    run_phase attn-prefill "${tune[@]}" attn_prefill --shapes attn.toml --regime l2 \
        --shape e4b.swa --shape e4b.full --shape 12b.full --shape 12b.swa --shape 31b.swa \
        --shape e4b.chunk --shape e4b.kv --out "$out_root/attn-prefill"
    ;;&
attn | attn-decode | all)
    run_phase attn-decode "${tune[@]}" attn_decode --shapes attn.toml --regime dram \
        --shape e4b.dec --shape 12b.dec --out "$out_root/attn-decode"
    ;;&
rows | all)
    for fam in rmsnorm gelu_mul embed ple softcap act_convert qk_norm_rope; do
        run_phase "rows-$fam" "${tune[@]}" "$fam" --shapes elementwise_tune.toml --regime dram \
            --shape "$fam." --out "$out_root/rows-$fam"
    done
    ;;
check | gemv | prefill | prefill-more | attn | attn-prefill | attn-decode) ;;
*)
    echo "unknown phase '$phase'" >&2
    exit 4
    ;;
esac
exit $status
