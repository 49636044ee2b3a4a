#!/usr/bin/env bash
# GPU call A (one H100): chained decode launches. In order: the parity
# tests that cover chaining (chained vs plain graph decode bit for bit, with
# and without the GEMV prefetch; graph vs eager; main and strict against the
# CPU engine), the timed decode graph, `check gemv` of the two prefetch
# variants, E4B Q8_0 bench of the build before (gemtune-prev) and this one,
# then `ab` plain vs main and main vs prefetch4 on E4B Q8_0.
# Stage first (release gemtune, gemtune-prev, the test executables), `run`
# with carry [".gpubase"].
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 585
pack() { tar -C "$OUT" -czf "$OUT/callA.tgz" r; }
P=reports/h100-2026-11-27-chained-decode/scripts
gpu_test cuda_parity 170 chained_decode graph_decode main_profile_agrees strict_profile_matches_the_cpu_engine_on_tiny
pack
gpu_test cuda_phases 60
pack
gpu_check gemv 45 --variant planes-fma-prefetch --variant dp4a-prefetch
pack
m=/tmp/e4b-q8_0.gguf
s=$SECONDS; gemtune synth e4b q8_0 $m > /dev/null && sync; echo "synth e4b q8_0 $((SECONDS - s)) s"
for b in gemtune-prev gemtune; do
  s=$SECONDS; timeout 40 $b bench -m $m -p 512 -n 128 -r 3 > "$R/bench-e4b-q8_0-$b.txt" 2> "$R/bench-e4b-q8_0-$b.log"
  echo "bench e4b $b rc=$? $((SECONDS - s)) s"; grep -E "^\| gemma" "$R/bench-e4b-q8_0-$b.txt"
done
pack
ab() {
  local name=$1 base=$2 cand=$3 to=$4
  [ "$(gpu_left)" -lt "$to" ] && { echo "ab $name: skipped (time)"; return; }
  s=$SECONDS; timeout "$to" gemtune ab --reps 6 --quiet --out "$R/ab-$name" --baseline "$base" --candidate "$cand" -m $m -p 512 -n 128 > "$R/ab-$name.txt" 2> "$R/ab-$name.log"
  echo "== ab $name: exit $? in $((SECONDS - s)) s"; cat "$R/ab-$name.txt"; rm -f "$R"/ab-$name/worker-*.log "$R"/ab-$name/*.png
  pack
}
ab e4b-q8-chained $P/plain.toml main 80
ab e4b-q8-prefetch4 main $P/prefetch4.toml 80
echo "total $((SECONDS - GPU_CALL_T0)) s"
pack
