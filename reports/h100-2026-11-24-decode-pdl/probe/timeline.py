#!/usr/bin/env python3
"""Summarize decode-timing CSVs written by the timing patch's probe test.

Each row is one split CTA (thread 0's %globaltimer, ns from the first CTA's
start): t0 start, t1 Q rows in shared memory, t2.. the wait for tile i done,
t14.. tile i's compute done, t26 the merge's first barrier, t27 the partial
write's start, t28 loop end, t29 end. The rows after "combine" are the
combine blocks: start, the wait for the splits done, end.
Prints mean [min, max] in microseconds per phase.
"""
import csv
import statistics as st
import sys


def span(v):
    return f"{st.mean(v) / 1000:6.2f} [{min(v) / 1000:5.2f}, {max(v) / 1000:5.2f}]" if v else "-"


for path in sys.argv[1:]:
    splits, combine = open(path).read().split("combine\n")
    rows = list(csv.reader(splits.splitlines()))[1:]
    cta = [(int(r[2]), [int(x) for x in r[3:]]) for r in rows]
    comb = [list(map(int, line.split(",")[1:])) for line in combine.splitlines()]
    print(path, "tiles per CTA", sorted({n for n, _ in cta}))
    print("  start      ", span([t[0] for _, t in cta]))
    print("  Q stored   ", span([t[1] for _, t in cta]))
    for i in range(min(12, max(n for n, _ in cta))):
        w = [t[2 + i] for n, t in cta if n > i]
        c = [t[14 + i] for n, t in cta if n > i]
        print(f"  tile {i} in  ", span(w), " done", span(c))
    print("  loop end   ", span([t[28] for _, t in cta]), " partial written", span([t[29] for _, t in cta]))
    print("  combine    ", span([x[0] for x in comb]), " splits done", span([x[1] for x in comb]),
          " end", span([x[2] for x in comb]))
