#!/usr/bin/env bash
# GPU call D (one H100): llama.cpp's llama-bench, built here from the
# llama-cpp-python 0.3.36 sdist's vendored llama.cpp (0c1e57098; trimmed
# source carried as .llama/llama.tar.xz, built by scripts/llama-build.sh),
# beside gemtune bench on the same synthetic 26B-A4B Q8_0 and Q4_K_M files,
# in one session. The build runs while the files are written.
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 590
pack() { tar -C "$OUT" -czf "$OUT/callD.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
s=$SECONDS
( LLAMA_TARBALL=.llama/llama.tar.xz bash $P/llama-build.sh > "$R/llama-build.log" 2>&1; echo "build rc=$? $((SECONDS - s)) s" >> "$R/llama-build.log" ) &
bpid=$!
for f in q8_0 q4_k_m; do
  t=$SECONDS; gemtune synth 26b-a4b $f /tmp/26b-$f.gguf > /dev/null && sync; echo "synth 26b $f $((SECONDS - t)) s"
done
wait $bpid
tail -3 "$R/llama-build.log"
pack
L=/tmp/llama.cpp/build/bin/llama-bench
for f in q8_0 q4_k_m; do
  m=/tmp/26b-$f.gguf
  if [ -x $L ] && [ "$(gpu_left)" -gt 60 ]; then
    t=$SECONDS; timeout $(( $(gpu_left) - 40 )) $L -m $m -ngl 99 -fa 1 -ub 512,2048 -b 2048 -p 512,2048 -n 128 -r 3 -o md > "$R/llama-bench-26b-$f.md" 2> "$R/llama-bench-26b-$f.log"
    echo "llama-bench 26b $f rc=$? $((SECONDS - t)) s"; cat "$R/llama-bench-26b-$f.md"
    pack
  fi
  if [ "$(gpu_left)" -gt 45 ]; then
    t=$SECONDS; timeout 60 gemtune bench -m $m -p 512,2048 -n 128 -r 3 > "$R/bench-26b-$f.txt" 2> "$R/bench-26b-$f.log"
    echo "gemtune bench 26b $f rc=$? $((SECONDS - t)) s"; grep -E "^\| gemma" "$R/bench-26b-$f.txt"
    pack
  fi
done
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
