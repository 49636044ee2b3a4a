#!/usr/bin/env bash
# On a GPU host, with the staged binary (.gpu/bin/gemtune) or GEMTUNE: the
# end-to-end A/B figures, one `gemtune ab` directory per comparison under
# OUTDIR (results.csv, summary.md, verdict.json, PNGs, worker logs).
#   bash scripts/gpu-ab.sh OUTDIR SET
# SET swa:      main vs flash-swa on E4B Q8_0 at 4096 and 16384 prompt tokens,
#               and on 12B Q4_0 at 4096 (synthetic models, written into /tmp
#               and deleted after).
# SET attn:     attn-mma vs main (the wgmma prefill attention end to end) and
#               main vs flash-swa on E4B Q8_0 at 4096 prompt tokens.
# SET profiles: main vs cublas, mma-sync, dp4a, mmq and strict on bench's
#               default model (synthetic E4B Q8_0), pp2048 + tg128.
# SET plan:     the previous build against this one (GEMTUNE_BASE: that
#               build's gemtune binary), both on main, on E4B Q8_0 and 12B
#               Q4_0 at pp2048 + tg128: an A/A of an engine refactor.
# Each SET fits a 10-minute slot on an H100. AB_REPS (default 12) sets --reps.
set -u
out=${1:?OUTDIR}
set_=${2:?SET (swa | attn | plan | profiles)}
bin=${GEMTUNE:-$PWD/.gpu/bin/gemtune}
reps=${AB_REPS:-12}
mkdir -p "$out"
status=0
ab() { # name args...
    local name=$1
    shift
    local t0=$SECONDS rc=0
    "$bin" ab --reps "$reps" --quiet --out "$out/$name" "$@" >"$out/$name.txt" 2>"$out/$name.log" || rc=$?
    echo "== $name: exit $rc in $((SECONDS - t0)) s: gemtune ab --reps $reps $*"
    cat "$out/$name.txt"
    [[ $rc == 0 ]] || tail -5 "$out/$name.log"
    # 1 (SLOW) and 2 (AMBIGUOUS) are verdicts; 3 and 4 are failures.
    [[ $rc -lt 3 ]] || status=$rc
}
synth() { # variant wtype -> path; flushed to disk before any timing
    local f=/tmp/$1-$2.gguf
    "$bin" synth "$1" "$2" "$f" >/dev/null && sync && echo "$f"
}
case $set_ in
swa)
    f=$(synth e4b q8_0)
    ab e4b-q8_0-p4096-flash-swa --baseline main --candidate flash-swa -m "$f" -p 4096 -n 128
    ab e4b-q8_0-p16384-flash-swa --baseline main --candidate flash-swa -m "$f" -p 16384 -n 128
    rm -f "$f"
    f=$(synth 12b q4_0)
    ab 12b-q4_0-p4096-flash-swa --baseline main --candidate flash-swa -m "$f" -p 4096 -n 128
    rm -f "$f"
    ;;
attn)
    f=$(synth e4b q8_0)
    ab e4b-q8_0-p4096-attn-mma --baseline attn-mma --candidate main -m "$f" -p 4096 -n 128
    ab e4b-q8_0-p4096-flash-swa --baseline main --candidate flash-swa -m "$f" -p 4096 -n 128
    rm -f "$f"
    ;;
plan)
    base=${GEMTUNE_BASE:?GEMTUNE_BASE must name the gemtune binary of the previous build}
    f=$(synth e4b q8_0)
    ab e4b-q8_0-plan-aa --baseline "$base" --candidate "$bin" -m "$f" -p 2048 -n 128
    rm -f "$f"
    f=$(synth 12b q4_0)
    ab 12b-q4_0-plan-aa --baseline "$base" --candidate "$bin" -m "$f" -p 2048 -n 128
    rm -f "$f"
    ;;
profiles)
    for p in cublas mma-sync dp4a mmq strict; do
        ab "e4b-q8_0-$p" --baseline main --candidate "$p" -p 2048 -n 128
    done
    ;;
*)
    echo "unknown SET '$set_' (swa | attn | plan | profiles)" >&2
    exit 4
    ;;
esac
exit $status
