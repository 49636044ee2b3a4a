#!/usr/bin/env bash
# On a GPU host, from the checkout root, after `bash .gpu/run.sh`'s staging
# (../shared/tools/stage-gpu.sh here): checks the forward's kernel families
# against the oracle, runs the attention and engine GPU tests, then a short
# bench of a synthetic model. Writes logs under $1 (default ./gpu-smoke).
#   bash scripts/gpu-smoke.sh OUTDIR [phase...]   phases: check attn engine bench
set -u
out=${1:-gpu-smoke}; shift || true
phases=${*:-check attn engine bench}
mkdir -p "$out"
export PATH="$PWD/.gpu/bin:$PATH"
t() { ls .gpu/tests/$1-* 2>/dev/null | head -1; }
for ph in $phases; do
  case $ph in
    check)
      gemtune check rmsnorm qk_norm_rope gelu_mul embed ple softcap act_convert attn_prefill attn_decode \
        --out "$out/check" > "$out/check.log" 2>&1; echo "check rc=$?"
      grep -E "fail|error|FAIL" "$out/check.log" | head -40
      tail -3 "$out/check.log" ;;
    attn)
      $(t gpu_attention) --include-ignored --test-threads=1 > "$out/attn.log" 2>&1; echo "gpu_attention rc=$?"
      grep -E "^test |panicked|FAIL|tiles \(" "$out/attn.log" | head -40 ;;
    engine)
      $(t cuda_parity) --include-ignored --test-threads=1 --nocapture > "$out/engine.log" 2>&1; echo "cuda_parity rc=$?"
      grep -E "^test |panicked|rms_rel|replays|error" "$out/engine.log" | head -40 ;;
    bench)
      gemtune synth e4b q8_0 /tmp/e4b-q8_0.gguf > /dev/null
      gemtune bench -m /tmp/e4b-q8_0.gguf -p 512,2048 -n 128 -r 3 -o md > "$out/bench.md" 2> "$out/bench.log"; echo "bench rc=$?"
      cat "$out/bench.md"; tail -5 "$out/bench.log" ;;
  esac
done
