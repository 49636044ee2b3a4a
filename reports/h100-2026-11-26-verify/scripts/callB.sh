#!/usr/bin/env bash
# GPU call B (one H100): the A/A of this engine against the build before the
# ForwardPlan (6026068, carried xz-compressed as .gpubase/gemtune-base.xz),
# both on profile main, 30 repetitions, E4B Q8_0 then 12B Q4_0 at pp2048 +
# tg128; then `gemtune check gemv` over its default shapes with the time
# left. Run after callA.sh on the same staged binaries.
set -u
cd "$(dirname "$0")/../../.."
t0=$SECONDS
[ -x .gpu/bin/gemtune ] || tar -xJf .gpubase/stage.tar.xz -C . || exit 4
mkdir -p /tmp/base && xz -dc .gpubase/gemtune-base.xz > /tmp/base/gemtune && chmod +x /tmp/base/gemtune || exit 4
export PATH="$PWD/.gpu/bin:$PATH"
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((585 - (SECONDS - t0))); }
ab() { # name model
  local l=$(left); [ "$l" -lt 60 ] && { echo "$1: skipped (time)"; return; }
  local s=$SECONDS
  timeout "$l" gemtune ab --reps 30 --quiet --out "$R/$1" --baseline /tmp/base/gemtune --candidate "$PWD/.gpu/bin/gemtune" -m "$2" -p 2048 -n 128 > "$R/$1.txt" 2>"$R/$1.log"; local rc=$?
  echo "== $1: exit $rc in $((SECONDS-s)) s"; cat "$R/$1.txt"; [ $rc -lt 3 ] || tail -5 "$R/$1.log"
  rm -rf "$R/$1"/worker-*.log 2>/dev/null
}
gemtune synth e4b q8_0 /tmp/e4b-q8_0.gguf > /dev/null && sync
ab e4b-q8_0-aa /tmp/e4b-q8_0.gguf
rm -f /tmp/e4b-q8_0.gguf
gemtune synth 12b q4_0 /tmp/12b-q4_0.gguf > /dev/null && sync
ab 12b-q4_0-aa /tmp/12b-q4_0.gguf
rm -f /tmp/12b-q4_0.gguf
l=$(left)
if [ "$l" -gt 40 ]; then
  s=$SECONDS; timeout "$l" gemtune check gemv --out /tmp/chk-gemv-default > "$R/check-gemv-default.txt" 2>&1
  echo "check gemv (default shapes) rc=$? $((SECONDS-s))s"; tail -3 "$R/check-gemv-default.txt"
  cp /tmp/chk-gemv-default/check.csv "$R/check-gemv-default.csv" 2>/dev/null
fi
tar -C "$OUT" -czf "$OUT/callB.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
