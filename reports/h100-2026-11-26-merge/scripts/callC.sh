#!/usr/bin/env bash
# GPU call C: CUDA-vs-CPU parity with the native weight types, and the GPU
# tests calls A and B did not reach (launch-argument check on).
set -u
cd "$(dirname "$0")/.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((570 - (SECONDS - t0))); }
tb() { # name timeout [args]
  local n=$1 to=$2; shift 2
  local l=$(left); [ "$l" -lt 20 ] && { echo "$n: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" .gpu/tests/$n-* --include-ignored --test-threads=1 "$@" > "$R/$n.log" 2>&1; local rc=$?
  echo "$n rc=$rc $((SECONDS-s))s: $(grep -E '^test result' "$R/$n.log" | tail -1)"
  grep -E "^test .*FAILED|panicked at" "$R/$n.log" | head -8
}
tb cuda_parity 240
tb cuda_phases 40
for w in q4_k_m bf16; do
  gemtune synth tiny $w /tmp/tiny-$w.gguf > /dev/null 2>&1
  timeout 40 gemtune run -v -m /tmp/tiny-$w.gguf -p Hello -n 8 > "$R/run-v-tiny-$w.txt" 2>&1; echo "run -v tiny $w rc=$?"; grep -iE "weights|convert|memory" "$R/run-v-tiny-$w.txt" | head -4
done
tb gpu_attention 150 wgmma_variants_pass_on_ragged_shapes windowed_kernel_visits windowed_output_differs
tb cli_ab 150 aa_on_the_gpu_is_same
tb cli_signals 60 tune_on_sigterm_writes_what_it_measured
tar -C "$OUT" -czf "$OUT/callC.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
