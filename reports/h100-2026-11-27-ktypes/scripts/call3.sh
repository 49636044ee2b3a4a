#!/usr/bin/env bash
# GPU call 3 (one H100): the gemv XSMEM=1 form (f32 activations staged in
# padded shared memory) checked on every spec shape it accepts, tuned
# against main's FMA GEMV and dp4a at m = 1 (dram) on the k-quant, 16-bit,
# Q8_0 and head shapes; then the `xsmem` profile against main end to end
# (E4B Q4_K_M and Q8_0, tg128, `ab`), cuda_parity under it, and the two
# staged tests call 2 left (SIGTERM during tune, after the test's fix; the
# router test).
set -u
cd "$(dirname "$0")/../../.."
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
. scripts/gpu-call.sh 580
pack() { tar -C "$OUT" -czf "$OUT/call3.tgz" r; }
gpu_check gemv 120 --variant 'xsmem*'
pack
T="--budget-ms 40 --min-reps 10 --max-reps 60 --regime dram --tokens 1 --no-reference"
V="--variant xsmem* --variant planes-fma --variant planes-fma+ROWS=2,WARPS=2 --variant h100-dp4a --variant planes-dp4a+KSPLIT=2,UNROLL=1"
s=$SECONDS; timeout 150 gemtune tune gemv --shapes decode_ktypes --shapes decode $T $V --out "$R/tune-gemv-xsmem" > "$R/tune-gemv-xsmem.txt" 2>&1
echo "tune gemv xsmem rc=$? $((SECONDS - s)) s"; pack
P=reports/h100-2026-11-27-ktypes/scripts/xsmem.toml
for w in q4_k_m q8_0; do
  [ "$(gpu_left)" -lt 90 ] && break
  gemtune synth e4b $w /tmp/e4b-$w.gguf > /dev/null && sync
  s=$SECONDS; timeout 120 gemtune ab --reps 10 --quiet --out "$R/ab-e4b-$w" --baseline main --candidate $P -m /tmp/e4b-$w.gguf -p 512 -n 128 > "$R/ab-e4b-$w.txt" 2> "$R/ab-e4b-$w.log"
  echo "== ab e4b $w main vs xsmem: exit $? in $((SECONDS - s)) s"; cat "$R/ab-e4b-$w.txt"; rm -f "$R"/ab-e4b-$w/worker-*.log
  rm -f /tmp/e4b-$w.gguf; pack
done
gpu_test cli_signals 120 tune_on_sigterm
gpu_test gpu_moe 100 moe_route_variants_pass
pack
echo "total $((SECONDS - GPU_CALL_T0)) s"
