#!/usr/bin/env bash
# Probe: decode tiles small enough that the next call's CTA fits beside a finishing one.
set -u
export GEMTUNE_CACHE_DIR=/tmp/cubin
B=.gpu-w/gemtune
rm -rf /tmp/pv && cp -r variants /tmp/pv
cat >> /tmp/pv/attn_decode.toml <<'T'

[[variant]]
name = "zz-b16-s3-z64"
description = "probe"
contract = "approx"
defines = { ALGO = 3, BQ = 8, BKV = 16, KW = 1, WD = 4, STAGES = 3, BULK = 1, QSPLIT = 1, SPLITS = 64 }

[[variant]]
name = "zz-b16-s3-z128"
description = "probe"
contract = "approx"
defines = { ALGO = 3, BQ = 8, BKV = 16, KW = 1, WD = 4, STAGES = 3, BULK = 1, QSPLIT = 1, SPLITS = 128 }

[[variant]]
name = "zz-b16-s4-z64"
description = "probe"
contract = "approx"
defines = { ALGO = 3, BQ = 8, BKV = 16, KW = 1, WD = 4, STAGES = 4, BULK = 1, QSPLIT = 1, SPLITS = 64 }

[[variant]]
name = "zz-b32-s2-z64"
description = "probe"
contract = "approx"
defines = { ALGO = 3, BQ = 8, BKV = 32, KW = 2, WD = 4, STAGES = 2, BULK = 1, QSPLIT = 1, SPLITS = 64 }

[[variant]]
name = "zz-b16-s3-z64-wd8"
description = "probe"
contract = "approx"
defines = { ALGO = 3, BQ = 8, BKV = 16, KW = 1, WD = 8, STAGES = 3, BULK = 1, QSPLIT = 1, SPLITS = 64 }
T
for r in 1 2; do
  $B tune attn_decode --variants-dir /tmp/pv --shapes attn.toml --shape e4b.dec16k --tokens 1 --regime dram --no-reference \
    --variant keymajor-bulk-qs-wd4 --variant 'zz-*' --budget-ms 100 --min-reps 20 --max-reps 200 --check-max-m 128 --out $OUT/p$r > $OUT/p$r.log 2>&1
  echo "run $r rc $?"
  python3 -c "
import csv
for x in csv.DictReader(open('$OUT/p$r/results.csv')):
    if x['shape'].startswith('e4b.dec16k@'): print(x['variant'], round(float(x['median_us']),2), round(float(x['pct_of_roof']),1), x['dyn_smem'], x.get('blocks_per_sm',''))
"
done
grep -E "rejected|fail" $OUT/p1.log | head
cd $OUT && tar -cf p.tar p1 p2 && rm -rf p1 p2
