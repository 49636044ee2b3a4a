#!/usr/bin/env bash
# GPU call B: the rest of the staged GPU tests (launch-argument check on),
# gemtune check gemv (every weight type), and the ab A/A against the
# session's starting build.
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((580 - (SECONDS - t0))); }
tb() { # name timeout [args]
  local n=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" .gpu/tests/$n-* --include-ignored --test-threads=1 "$@" > "$R/$n.log" 2>&1; local rc=$?
  echo "$n rc=$rc $((SECONDS-s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
  grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -6
}
tb gpu_families 200 --skip timing_probe
tb gpu_attention 120
tb gpu_reference 60
tb cli_ab 120
tb cli_check 60
tb cli_tune 60
tb cli_signals 60
s=$SECONDS; l=$(left); timeout $(( l < 150 ? l : 150 )) gemtune check gemv --out /tmp/chk-gemv > "$R/check-gemv.txt" 2>&1; echo "check gemv rc=$? $((SECONDS-s))s"; tail -2 "$R/check-gemv.txt"; cp /tmp/chk-gemv/check.csv "$R/check-gemv.csv" 2>/dev/null
tar -C "$OUT" -czf "$OUT/callB.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
