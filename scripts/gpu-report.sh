#!/usr/bin/env bash
# The GPU reports of one machine, into reports/<date>-<gpu>/ (or OUT_ROOT):
#
#   check             gemtune check of every family (a shape subset that keeps the oracle fast)
#   tune-<family>     gemtune tune of one family at the e4b shapes, both regimes, with the
#                     cuBLAS reference rows (one phase per variants/<family>.toml)
#   bench             gemtune bench of e4b (the synthetic q8_0 default) and 12b (synthetic q4_0)
#   ab-<profile>      gemtune ab --baseline main --candidate <profile> (one per profile)
#   tune | ab         every tune-* / ab-* phase in turn (more than one slot)
#   all               everything above, in that order
#   list              print the phases
#
# Each single phase fits a 10-minute slot on an H100 and writes one directory
# (CSV, summary.md, PNGs); every command run, its exit code and its duration
# are appended to <root>/commands.log, so a report can be reproduced line by
# line. With BASELINE_ROOT set to an earlier report directory, each phase's
# CSV is also compared with the same file there through `gemtune report`
# (into <phase>/vs-baseline/; exit 1 on a regression).
#
# usage: scripts/gpu-report.sh PHASE [OUT_ROOT]
# Environment: GEMTUNE (binary; default cargo's release build, found by
# scripts/gemtune-bin.sh),
# GEMTUNE_BUDGET_MS (tune budget per cell, default 100), MODELS (where synthetic
# models are written, default target/gemtune/models), AB_REPS (default 12),
# BASELINE_ROOT (see above).
# Exit: the last non-zero exit code of a phase (0 when all passed).
set -euo pipefail
cd "$(dirname "$0")/.."

phase=${1:?usage: scripts/gpu-report.sh PHASE [OUT_ROOT]  (scripts/gpu-report.sh list)}

families() { for f in variants/*.toml; do basename "$f" .toml; done; }
profiles() { for f in variants/profiles/*.toml; do [[ -e $f ]] && basename "$f" .toml; done; }

if [[ $phase == list ]]; then
    echo check
    families | sed 's/^/tune-/'
    echo bench
    profiles | grep -vx main | sed 's/^/ab-/' || true
    exit 0
fi

# NVRTC, cuBLAS (and NVML from the driver), as scripts/gpu-tune.sh does.
if py_libs=$(python3 -c 'import nvidia, os; print(":".join(d for d in (os.path.join(p, "cu13", "lib") for p in nvidia.__path__) if os.path.isdir(d)))' 2>/dev/null) &&
    [[ -n "$py_libs" ]]; then
    export LD_LIBRARY_PATH="$py_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 |
    tr 'A-Z' 'a-z' | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/-/g' -e 's/-$//')
root=${2:-reports/$(date -u +%Y-%m-%d)-${gpu:-nogpu}}
bin=$(scripts/gemtune-bin.sh --release)
budget=${GEMTUNE_BUDGET_MS:-100}
models=${MODELS:-target/gemtune/models}
mkdir -p "$root" "$models"
log=$root/commands.log
status=0

# run NAME CMD...: runs, logs the command, its exit code and duration.
run() {
    local name=$1
    shift
    echo "== $name: $*" >&2
    local t0=$SECONDS rc=0
    "$@" || rc=$?
    printf '%s\t%s\texit %d\t%ds\n' "$(date -u +%FT%TZ)" "$*" "$rc" $((SECONDS - t0)) >>"$log"
    if [[ $rc != 0 ]]; then
        echo "== $name exited $rc" >&2
        status=$rc
    fi
}

# vs_baseline DIR FILE: compare DIR/FILE with the same file under BASELINE_ROOT.
vs_baseline() {
    local rel=${1#"$root"/} file=$2
    if [[ -n ${BASELINE_ROOT:-} && -f $BASELINE_ROOT/$rel/$file && -f $1/$file ]]; then
        run "$rel vs baseline" "$bin" report --baseline "$BASELINE_ROOT/$rel/$file" \
            --current "$1/$file" --out "$1/vs-baseline"
    fi
}

# The e4b shapes and token counts of each family (a new family is tuned on
# its spec's own shapes, filtered to e4b).
tune_args() {
    case $1 in
    gemv) echo "--shapes decode.toml --tokens 1,2,4,8" ;;
    mmq | gemm_dq | gemm_wgmma) echo "--shapes ffn.toml --shapes attn_proj.toml --tokens 512,2048" ;;
    quantize_q8_1) echo "--shapes ffn.toml --tokens 1,512,2048" ;;
    *) echo "" ;;
    esac
}

phase_check() {
    run check "$bin" check --out "$root/check" \
        --tokens 1,3,7,8,113 --shape e4b.ffn_up --shape e4b.attn_k --shape 12b.ffn_up --shape edge.
    vs_baseline "$root/check" check.csv
}

phase_tune() {
    local fam=$1
    # shellcheck disable=SC2046
    run "tune-$fam" "$bin" tune "$fam" $(tune_args "$fam") --shape e4b. --regime both \
        --budget-ms "$budget" --min-reps 10 --max-reps 100 --check-max-m 128 --out "$root/tune-$fam"
    vs_baseline "$root/tune-$fam" results.csv
}

phase_bench() {
    local dir=$root/bench
    mkdir -p "$dir"
    # e4b: bench's own synthetic e4b q8_0; 12b: a synthetic q4_0 file.
    run bench-e4b sh -c "\"$bin\" bench -o csv > \"$dir/bench-e4b.csv\""
    if [[ ! -f $models/12b-q4_0.gguf ]]; then
        run synth-12b "$bin" synth 12b q4_0 "$models/12b-q4_0.gguf"
    fi
    run bench-12b sh -c "\"$bin\" bench -m \"$models/12b-q4_0.gguf\" -o csv > \"$dir/bench-12b.csv\""
    vs_baseline "$dir" bench-e4b.csv
    vs_baseline "$dir" bench-12b.csv
}

phase_ab() {
    local p=$1
    run "ab-$p" "$bin" ab --baseline main --candidate "$p" --reps "${AB_REPS:-12}" --quiet \
        --out "$root/ab-$p"
    vs_baseline "$root/ab-$p" results.csv
}

case $phase in
check) phase_check ;;
tune-*) phase_tune "${phase#tune-}" ;;
tune) for f in $(families); do phase_tune "$f"; done ;;
bench) phase_bench ;;
ab-*) phase_ab "${phase#ab-}" ;;
ab) for p in $(profiles | grep -vx main); do phase_ab "$p"; done ;;
all)
    phase_check
    for f in $(families); do phase_tune "$f"; done
    phase_bench
    for p in $(profiles | grep -vx main); do phase_ab "$p"; done
    ;;
*)
    echo "unknown phase '$phase' (scripts/gpu-report.sh list)" >&2
    exit 4
    ;;
esac
echo "reports in $root (commands in $log)" >&2
exit $status
