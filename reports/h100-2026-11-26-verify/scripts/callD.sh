#!/usr/bin/env bash
# GPU call D (one H100, fresh machine: cold NVRTC and cubin caches): the
# scale_expand variants (a thread per group, per 8 groups: checked, tuned)
# and main's engine parity with the per-8 variant, the README's main command on a GPU (`gemtune demo`, timed from a cold cache),
# a cold `tune attn_decode` over two shapes (compile wall time, the compile
# line), the scale expansion's price at pp512 (E4B Q4_K_M, resident-scales
# vs main), `cli_signals`'s SIGTERM-during-tune test, the E2B equal-work bench,
# and `gpu_moe`'s router test that call C's limit cut.
set -u
cd "$(dirname "$0")/../../.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
nproc | tee "$R/nproc.txt"
left() { echo $((500 - (SECONDS - t0))); }
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
  local s=$SECONDS
  timeout "$to" gemtune check "$f" "$@" --out "/tmp/chk-$f" > "$R/check-$f.txt" 2>&1
  echo "check $f rc=$? $((SECONDS-s))s"; tail -2 "$R/check-$f.txt"; cp "/tmp/chk-$f/check.csv" "$R/check-$f.csv" 2>/dev/null
}
ck scale_expand 40
s=$SECONDS; timeout 60 gemtune tune scale_expand --out /tmp/tune-se > "$R/tune-scale_expand.txt" 2>&1; echo "tune scale_expand rc=$? $((SECONDS-s)) s"
cp /tmp/tune-se/summary.md "$R/tune-scale_expand-summary.md" 2>/dev/null; cp /tmp/tune-se/results.csv "$R/tune-scale_expand-results.csv" 2>/dev/null
grep -A16 -iE "^## best|best variant" "$R/tune-scale_expand-summary.md" | head -30
tb cuda_parity 80 main_
s=$SECONDS; timeout 200 gemtune demo > "$R/demo.txt" 2> "$R/demo.log"; echo "demo rc=$? $((SECONDS-s)) s"; tail -25 "$R/demo.txt"
s=$SECONDS; timeout 150 gemtune tune attn_decode --shapes attn.toml --shape e4b.dec16k --shape e4b.dec_w512 --no-reference --out /tmp/tune-ad > "$R/tune-attn_decode.txt" 2>&1; echo "tune attn_decode (cold, 2 shapes) rc=$? $((SECONDS-s)) s"; grep -iE "^compile|compil" "$R/tune-attn_decode.txt" | tail -3
cp /tmp/tune-ad/summary.md "$R/tune-attn_decode-summary.md" 2>/dev/null
l=$(left); if [ "$l" -gt 90 ]; then
  gemtune synth e4b q4_k_m /tmp/e4b-q4_k_m.gguf > /dev/null && sync
  s=$SECONDS; timeout 120 gemtune ab --reps 10 --quiet --phase-blocks 2 --out "$R/e4b-q4_k_m-expand-pp512" --baseline resident-scales --candidate main -m /tmp/e4b-q4_k_m.gguf -p 512 -n 32 > "$R/e4b-q4_k_m-expand-pp512.txt" 2> "$R/e4b-q4_k_m-expand-pp512.log"
  echo "== ab pp512 resident-scales vs main: exit $? in $((SECONDS-s)) s"; cat "$R/e4b-q4_k_m-expand-pp512.txt"; rm -f "$R"/e4b-q4_k_m-expand-pp512/worker-*.log
  rm -f /tmp/e4b-q4_k_m.gguf
fi
tb cli_signals 160 tune_on_sigterm
l=$(left); if [ "$l" -gt 70 ]; then
  gemtune synth e2b q8_0 /tmp/e2b-q8_0.gguf > /dev/null && sync
  timeout 60 gemtune bench -m /tmp/e2b-q8_0.gguf -p 512 -n 0 -r 3 --full-work > "$R/bench-e2b-full.txt" 2>&1; echo "bench e2b full pp512 rc=$?"
  timeout 60 gemtune bench -m /tmp/e2b-q8_0.gguf -p 2048 -n 0 -r 3 --full-work --ubatch 512 > "$R/bench-e2b-full-ub512.txt" 2>&1; echo "bench e2b full ub512 rc=$?"
  grep -hE "^\| gemma" "$R"/bench-e2b-*.txt
  rm -f /tmp/e2b-q8_0.gguf
fi
tb gpu_moe 120 moe_route_variants_pass
tar -C "$OUT" -czf "$OUT/callD.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
