#!/usr/bin/env bash
# On a GPU host: llama-bench-style rows of synthetic Gemma 4 models with the
# staged binary (.gpu/bin/gemtune), into OUTDIR as markdown and CSV. Each
# model is synthesized into /tmp, measured, and deleted.
#   bash scripts/gpu-bench.sh OUTDIR SET
# SET a: E4B Q8_0 (pp512, pp2048, tg128; depth 4096; phases; cublas,
#        flash-swa, dp4a and full-bkv32 arms) and E2B Q8_0;
# SET b: E4B Q4_0, 12B Q4_0 (phases, full-bkv32 arm at pp4096), 31B Q4_0.
# full-bkv32 is `main` with the head-dim-512 prefill attention on 32-key
# tiles over 4 dim warps with two K/V stages (written to /tmp; the arm main's
# 64-key, 2-dim-warp, one-stage tile is judged against end to end).
set -u
out=${1:?OUTDIR}; set_=${2:-a}
mkdir -p "$out"
export PATH="$PWD/.gpu/bin:$PATH"
b() { # name args...
  local name=$1; shift
  gemtune bench "$@" -o csv > "$out/$name.csv" 2> "$out/$name.log"; local rc=$?
  echo "== $name rc=$rc"; grep -v "warm-up\|: rep " "$out/$name.log" | tail -25
  python3 - "$out/$name.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(f"| {r['model']} {r['wtype']} | {r['profile']} | {r['test']} | {float(r['tps_mean']):.2f} ± {float(r['tps_sd']):.2f} |")
PY
}
bkv32=/tmp/full-bkv32.toml
cat > "$bkv32" <<'TOML'
name = "full-bkv32"
base = "main"
description = "main with 32-key tiles, 4 dim warps and 2 stages on the head-dim-512 prefill attention"
[slot."attn_prefill.full"]
family = "attn_prefill"
defines = { ALGO = 1, BQ = 64, BKV = 32, WD = 4, STAGES = 2, CP_ASYNC = 1, WINDOWED = 0 }
fallback = "attn_full_small"
why = "the arm main's tile is measured against"
TOML
# sync: the 8-30 GB just written is flushed before timing starts (write-back
# of dirty pages stalls the first test otherwise).
m() { gemtune synth "$1" "$2" "/tmp/$1-$2.gguf" > /dev/null && sync && echo "/tmp/$1-$2.gguf"; }
case $set_ in
  a)
    f=$(m e4b q8_0)
    b e4b-q8_0-main -m "$f" -p 512,2048 -n 128 -r 5
    b e4b-q8_0-d4096 -m "$f" -p 4096 -n 128 -d 4096 -r 3
    b e4b-q8_0-phases -m "$f" -p 2048 -n 128 -r 1 --profile-phases
    b e4b-q8_0-cublas -m "$f" -p 2048 -n 0 -r 5 --profile cublas
    b e4b-q8_0-flash-swa -m "$f" -p 2048 -n 0 -r 5 --profile flash-swa
    b e4b-q8_0-dp4a -m "$f" -p 0 -n 128 -r 5 --profile dp4a
    b e4b-q8_0-main-p4096 -m "$f" -p 4096 -n 0 -r 5
    b e4b-q8_0-full-bkv32-p4096 -m "$f" -p 4096 -n 0 -r 5 --profile "$bkv32"
    rm -f "$f"
    f=$(m e2b q8_0)
    b e2b-q8_0-main -m "$f" -p 2048 -n 128 -r 5
    rm -f "$f" ;;
  b)
    f=$(m e4b q4_0)
    b e4b-q4_0-main -m "$f" -p 2048 -n 128 -r 5
    rm -f "$f"
    f=$(m 12b q4_0)
    b 12b-q4_0-main -m "$f" -p 2048 -n 128 -r 5
    b 12b-q4_0-phases -m "$f" -p 2048 -n 128 -r 1 --profile-phases
    b 12b-q4_0-main-p4096 -m "$f" -p 4096 -n 0 -r 3
    b 12b-q4_0-full-bkv32-p4096 -m "$f" -p 4096 -n 0 -r 3 --profile "$bkv32"
    rm -f "$f"
    f=$(m 31b q4_0)
    b 31b-q4_0-main -m "$f" -p 2048 -n 128 -r 3
    rm -f "$f" ;;
esac
