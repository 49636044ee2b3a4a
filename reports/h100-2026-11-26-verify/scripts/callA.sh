#!/usr/bin/env bash
# GPU call A (one H100, `nvidia-h100-x1`) for the work of the second
# 2026-11-26 session, which had no device time: everything below was
# built and tested on the CPU only. Stage first (here):
#   bash ../shared/tools/stage-gpu.sh
#   tar -C . -cf - .gpu | xz -9e --lzma2=dict=192MiB > .gpubase/stage.tar.xz
# then `run` with carry [".gpubase"] and `bash reports/h100-2026-11-26-verify/scripts/callA.sh`.
set -u
cd "$(dirname "$0")/../../.."
t0=$SECONDS
tar -xJf .gpubase/stage.tar.xz -C . || exit 4
export PATH="$PWD/.gpu/bin:$PATH" GEMTUNE_CHECK_ARGS=1
R="$OUT/r"; mkdir -p "$R"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,driver_version --format=csv,noheader | tee "$R/gpu.txt"
left() { echo $((570 - (SECONDS - t0))); }
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
  local l=$(left); [ "$l" -lt 30 ] && { echo "check $f: skipped (time)"; return; }
  [ "$to" -gt "$l" ] && to=$l
  local s=$SECONDS
  timeout "$to" gemtune check "$f" "$@" --out "/tmp/chk-$f" > "$R/check-$f.txt" 2>&1
  echo "check $f rc=$? $((SECONDS-s))s"; tail -2 "$R/check-$f.txt"; cp "/tmp/chk-$f/check.csv" "$R/check-$f.csv" 2>/dev/null
}
# 1. Engine parity: head_convert fix, cuBLAS mixed Q|K|V, --full-work (strict).
tb cuda_parity 170
# 2. The k-quant GEMV after the 5..8-token segment loop, and the MoE router
#    and expert GEMV families (bit-exact selection, fp values).
ck gemv 150 --shapes edge_ktypes --shapes decode_ktypes_check
tb gpu_moe 120
ck scale_expand 60
ck moe_route 90
ck moe_gemv 120
# 3. bench's GFLOP/t and --full-work on the GPU, and the MoE refusal.
tb cli_bench 60
tb cli_moe 60
s=$SECONDS; timeout 150 gemtune bench -p 512,2048 -n 32 -r 3 > "$R/bench-e4b-trimmed.txt" 2>&1; echo "bench trimmed rc=$? $((SECONDS-s))s"
s=$SECONDS; timeout 150 gemtune bench -p 512,2048 -n 32 -r 3 --full-work > "$R/bench-e4b-full.txt" 2>&1; echo "bench full rc=$? $((SECONDS-s))s"
s=$SECONDS; timeout 100 gemtune bench -p 2048 -n 0 -r 3 --full-work --ubatch 512 > "$R/bench-e4b-full-ub512.txt" 2>&1; echo "bench full ub512 rc=$? $((SECONDS-s))s"
grep -hE "^\| e4b" "$R"/bench-e4b-*.txt
# 4. tune --strategy on the GPU (search through the tune worker).
tb cli_tune_search 120
tar -C "$OUT" -czf "$OUT/callA.tgz" r && rm -rf "$R"
echo "total $((SECONDS-t0)) s"
