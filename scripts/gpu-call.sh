#!/usr/bin/env bash
# Helpers of a one-call GPU script (the `run` tool: one command, a time
# limit, results under $OUT). Source it from the checkout root after
# unpacking the staged binaries (.gpu/, ../shared/tools/stage-gpu.sh):
#
#   . scripts/gpu-call.sh 570        # seconds this call may spend
#   gpu_test cuda_parity 150 [FILTER]  # a staged test binary, ignored tests included
#   gpu_check gemv 120 [ARGS]          # gemtune check FAMILY into $R
#   gpu_ab NAME BASE CAND 90 10 MODEL 512  # gemtune ab into $R/ab-NAME
#
# Results go to $R ($OUT/r); `gpu_left` is the time left. Every step takes
# at most its own timeout and the time left, and is skipped with a line
# when too little is left, so the call ends inside its limit with what it
# finished already under $OUT.
GPU_CALL_T0=$SECONDS
GPU_CALL_BUDGET=${1:-570}
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"
mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"

gpu_left() { echo $((GPU_CALL_BUDGET - (SECONDS - GPU_CALL_T0))); }

# gpu_test NAME TIMEOUT [FILTER...]: .gpu/tests/NAME-* into $R/NAME.log.
gpu_test() {
    local n=$1 to=$2
    shift 2
    local l
    l=$(gpu_left)
    [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
    [ "$to" -gt "$l" ] && to=$l
    local s=$SECONDS
    timeout "$to" .gpu/tests/"$n"-* --include-ignored --test-threads=1 "$@" >"$R/$n.log" 2>&1
    local rc=$?
    echo "$n rc=$rc $((SECONDS - s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
    grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -6
}

# gpu_check FAMILY TIMEOUT [ARGS...]: gemtune check into $R/check-FAMILY.*.
gpu_check() {
    local f=$1 to=$2
    shift 2
    local l
    l=$(gpu_left)
    [ "$l" -lt 30 ] && { echo "check $f: skipped (time)"; return; }
    [ "$to" -gt "$l" ] && to=$l
    local s=$SECONDS
    timeout "$to" gemtune check "$f" "$@" --out "/tmp/chk-$f" >"$R/check-$f.txt" 2>&1
    echo "check $f rc=$? $((SECONDS - s))s"
    tail -2 "$R/check-$f.txt"
    cp "/tmp/chk-$f/check.csv" "$R/check-$f.csv" 2>/dev/null
}

# gpu_ab NAME BASELINE CANDIDATE TIMEOUT REPS MODEL PROMPT: `gemtune ab`
# (decode tg128 after a PROMPT-token prefill) into $R/ab-NAME; skipped with
# a line when less than TIMEOUT is left. Worker logs and plots are dropped.
gpu_ab() {
    local name=$1 base=$2 cand=$3 to=$4 reps=$5 m=$6 p=$7
    [ "$(gpu_left)" -lt "$to" ] && { echo "ab $name: skipped (time)"; return; }
    local s=$SECONDS
    timeout "$to" gemtune ab --reps "$reps" --quiet --out "$R/ab-$name" --baseline "$base" \
        --candidate "$cand" -m "$m" -p "$p" -n 128 >"$R/ab-$name.txt" 2>"$R/ab-$name.log"
    echo "== ab $name: exit $? in $((SECONDS - s)) s"
    cat "$R/ab-$name.txt"
    rm -f "$R"/ab-"$name"/worker-*.log "$R"/ab-"$name"/*.png
}
