#!/usr/bin/env python3
"""Per shape, the fastest variant of each run directory's results.csv and
the median of every run's winner measured in the other runs: whether 1, 2
and 4 GPUs pick the same winner, or winners within each other's noise.

    python3 winners.py FILE1 FILE2 ...   (results.csv, or .csv.gz)
"""
import csv
import gzip
import io
import sys


def rows_of(path):
    raw = gzip.open(path) if path.endswith(".gz") else open(path, "rb")
    return csv.DictReader(io.TextIOWrapper(raw, newline=""))


runs = {}
for d in sys.argv[1:]:
    rows = [r for r in rows_of(d) if r["median_us"]]
    runs[d] = {(r["shape"], r["variant"]): (float(r["median_us"]), r["device_index"]) for r in rows}

shapes = sorted({s for t in runs.values() for (s, _) in t})
print("| shape | " + " | ".join(f"winner in {d}" for d in runs) + " | worst winner's median over the best, per run |")
print("|---|" + "---|" * len(runs) + "---|")
same = 0
for s in shapes:
    win = {}
    for d, t in runs.items():
        cand = [(m, v) for (sh, v), (m, _) in t.items() if sh == s]
        win[d] = min(cand)[1]
    spread = []
    for d, t in runs.items():
        best = min(m for (sh, _), (m, _) in t.items() if sh == s)
        worst = max(t[(s, w)][0] for w in win.values() if (s, w) in t)
        spread.append(f"{worst / best:.3f}")
    same += len(set(win.values())) == 1
    print(f"| {s} | " + " | ".join(f"`{w}`" for w in win.values()) + " | " + ", ".join(spread) + " |")
print(f"\n{same} of {len(shapes)} shapes: the same winner in every run")
