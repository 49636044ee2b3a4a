#!/usr/bin/env bash
# GPU call A: engine parity + graph phases + bench accounting + the K-quant
# kernel checks, launch-argument check on.
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((575 - (SECONDS - t0))); }
tb() { # name timeout [filter]
  local n=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" .gpu/tests/$n-* --include-ignored --test-threads=1 "$@" > "$R/$n.log" 2>&1; local rc=$?
  echo "$n rc=$rc $((SECONDS-s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
  grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -6
}
tb cuda_parity 150
tb cuda_phases 60
tb cli_bench 60
s=$SECONDS; timeout 100 gemtune bench -p 512 -n 128 --profile-phases > "$R/bench-e4b.txt" 2>&1; echo "bench e4b rc=$? $((SECONDS-s))s"; grep -E "tg128|pp512|floor|HBM|gap" "$R/bench-e4b.txt" | head -12
for f in gemm_wgmma gemm_dq; do
  l=$(left); [ "$l" -lt 30 ] && break
  s=$SECONDS; timeout $(( l < 110 ? l : 110 )) gemtune check $f --out /tmp/chk-$f > "$R/check-$f.txt" 2>&1; echo "check $f rc=$? $((SECONDS-s))s"; tail -3 "$R/check-$f.txt"; cp /tmp/chk-$f/check.csv "$R/check-$f.csv" 2>/dev/null
done
tb gpu_families 150
tar -C "$OUT" -czf "$OUT/callA.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
