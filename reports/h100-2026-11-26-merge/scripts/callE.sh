#!/usr/bin/env bash
# GPU call E: parity after the head_convert and cuBLAS-run fixes, the 12B
# Q4_0 A/A against the session's starting build again, then cli_ab's GPU A/A.
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
mkdir -p /tmp/base && cp gemtune-base /tmp/base/gemtune
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((470 - (SECONDS - t0))); }
tb() { # name timeout [args]
  local n=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" .gpu/tests/$n-* --include-ignored --test-threads=1 "$@" > "$R/$n.log" 2>&1; local rc=$?
  echo "$n rc=$rc $((SECONDS-s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
  grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -8
}
tb cuda_parity 150
gemtune synth 12b q4_0 /tmp/12b-q4_0.gguf > /dev/null && sync
timeout 60 gemtune run -v -m /tmp/12b-q4_0.gguf -p Hello -n 4 > "$R/run-v-12b-q4_0.txt" 2>&1; grep -iE "convert|device memory" "$R/run-v-12b-q4_0.txt" | head -3
s=$SECONDS; l=$(left)
GEMTUNE_CHECK_ARGS=0 timeout "$l" gemtune ab --reps 10 --quiet --out "$R/12b-q4_0-aa" --baseline /tmp/base/gemtune --candidate "$PWD/.gpu/bin/gemtune" -m /tmp/12b-q4_0.gguf -p 2048 -n 128 > "$R/12b-q4_0-aa.txt" 2>"$R/12b-q4_0-aa.log"; rc=$?
echo "== 12b-q4_0-aa: exit $rc in $((SECONDS-s)) s"; cat "$R/12b-q4_0-aa.txt"; rm -f "$R"/12b-q4_0-aa/worker-*.log
rm -f /tmp/12b-q4_0.gguf
tb cli_ab 240 aa_on_the_gpu_is_same
tar -C "$OUT" -czf "$OUT/callE.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
