#!/usr/bin/env bash
# On a GPU host, from the checkout root, with the release binary and the test
# executables staged under .gpu/ (bin/, tests/): checks the forward's kernel
# families against the oracle, runs the GPU tests, then a short bench of a
# synthetic model. Writes logs under $1 (default ./gpu-smoke).
#   bash scripts/gpu-smoke.sh OUTDIR [phase...]
# phases: check attn engine bench, and gpu-tests (every test marked
# `needs a CUDA GPU` in every staged test executable)
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
    gpu-tests)
      for f in .gpu/tests/*; do
        [ -x "$f" ] || continue
        n=$(basename "$f" | sed 's/-[0-9a-f]*$//')
        "$f" --ignored --test-threads=1 > "$out/gpu-tests-$n.log" 2>&1; rc=$?
        r=$(grep -E "^test result" "$out/gpu-tests-$n.log" | tail -1)
        case $r in *" 0 passed; 0 failed"*) continue ;; esac
        echo "$n rc=$rc: $r"
        grep -E "^test .*(ok|FAILED)$|panicked" "$out/gpu-tests-$n.log" | head -30
      done ;;
    bench)
      gemtune synth e4b q8_0 /tmp/e4b-q8_0.gguf > /dev/null
      gemtune bench -m /tmp/e4b-q8_0.gguf -p 512,2048 -n 128 -r 3 -o md > "$out/bench.md" 2> "$out/bench.log"; echo "bench rc=$?"
      cat "$out/bench.md"; tail -5 "$out/bench.log" ;;
  esac
done
