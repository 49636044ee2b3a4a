#!/usr/bin/env bash
# GPU call C (one H100): main with one scale plane per quantized matrix
# (gemm_scales = "expand": scale_expand before each prefill GEMM) and the
# 88-byte Q6_K GEMV side record. Engine parity (every native type, strict
# and main, the native-upload bound), the scale_expand and Q6_K GEMV checks,
# then the price end to end: `ab --baseline resident-scales --candidate
# main` on E4B Q4_K_M and Q8_0, and bench/run -v of E4B Q4_K_M for the
# device memory against the file.
set -u
cd "$(dirname "$0")/../../.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((585 - (SECONDS - t0))); }
tb() { # name timeout [filter]
  local n=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" .gpu/tests/$n-* --include-ignored --test-threads=1 "$@" > "$R/$n.log" 2>&1; local rc=$?
  echo "$n rc=$rc $((SECONDS-s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
  grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -6
}
ck() { # family timeout [args]
  local f=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 30 ] && { echo "check $f: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" gemtune check "$f" "$@" --out "/tmp/chk-$f" > "$R/check-$f.txt" 2>&1
  echo "check $f rc=$? $((SECONDS-s))s"; tail -2 "$R/check-$f.txt"; cp "/tmp/chk-$f/check.csv" "$R/check-$f.csv" 2>/dev/null
}
ab() { # name model reps args...
  local n=$1 m=$2 reps=$3; shift 3
  local l=$(left); [ "$l" -lt 60 ] && { echo "$n: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$l" gemtune ab --reps "$reps" --quiet --out "$R/$n" --baseline resident-scales --candidate main -m "$m" "$@" > "$R/$n.txt" 2>"$R/$n.log"; local rc=$?
  echo "== $n: exit $rc in $((SECONDS-s)) s"; cat "$R/$n.txt"; [ $rc -lt 3 ] || tail -5 "$R/$n.log"
  rm -rf "$R/$n"/worker-*.log 2>/dev/null
}
tb cuda_parity 150
ck scale_expand 40
s=$SECONDS; gemtune synth e4b q4_k_m /tmp/e4b-q4_k_m.gguf > /dev/null && sync; echo "synth e4b q4_k_m $((SECONDS-s)) s, $(stat -c %s /tmp/e4b-q4_k_m.gguf) bytes"
for p in main resident-scales; do
  timeout 60 gemtune run -v --profile $p -m /tmp/e4b-q4_k_m.gguf -p Hello -n 4 > "$R/run-v-e4b-q4_k_m-$p.txt" 2>&1; echo "run -v $p: $(grep -iE 'weights' "$R/run-v-e4b-q4_k_m-$p.txt" | head -2)"
done
ab e4b-q4_k_m-expand /tmp/e4b-q4_k_m.gguf 10 -p 2048 -n 128
l=$(left); [ "$l" -gt 60 ] && { timeout 80 gemtune bench -m /tmp/e4b-q4_k_m.gguf -p 512,2048 -n 128 -r 3 > "$R/bench-e4b-q4_k_m.txt" 2>&1; echo "bench q4_k_m rc=$?"; grep -E "^\| gemma|convert|weights" "$R/bench-e4b-q4_k_m.txt" | head -6; }
rm -f /tmp/e4b-q4_k_m.gguf
ck gemv 60 --shapes edge_q6k
tb cli_tune_search 40
s=$SECONDS; gemtune synth e4b q8_0 /tmp/e4b-q8_0.gguf > /dev/null && sync
ab e4b-q8_0-expand /tmp/e4b-q8_0.gguf 10 -p 2048 -n 32 --phase-blocks 0
rm -f /tmp/e4b-q8_0.gguf
tb gpu_moe 100
tar -C "$OUT" -czf "$OUT/callC.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
