#!/usr/bin/env python3
"""Per-kernel totals of an ncu CSV (--metrics gpu__time_duration.sum --csv), largest first.

Usage: scripts/ncu-summary.py FILE.csv [...]   (as written by scripts/device-profile.sh)
Kernels are grouped by name (template arguments kept) and grid size; times in microseconds.
"""
import collections
import csv
import signal
import sys

# Read through `| head`: a closed pipe ends the listing quietly, not with a traceback and rc 1.
signal.signal(signal.SIGPIPE, signal.SIG_DFL)

UNIT = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def summarize(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next((r for r in rows if "Kernel Name" in r and "Metric Value" in r), None)
    if header is None:
        print(f"== {path}: no ncu rows")
        return
    col = {name: i for i, name in enumerate(header)}
    total = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if len(r) != len(header) or r is header or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        name = r[col["Kernel Name"]].split("(")[0].replace("void ", "").replace("(anonymous namespace)::", "").replace("lmserve::<unnamed>::", "").replace("unnamed>::", "")
        key = f"{name} grid {r[col['Grid Size']]}"
        us = float(r[col["Metric Value"]].replace(",", "")) * UNIT.get(r[col["Metric Unit"]], 1.0)
        total[key][0] += 1
        total[key][1] += us
    step = sum(t for _, t in total.values())
    print(f"== {path}: {step:.1f} us in {sum(n for n, _ in total.values())} kernels")
    for key, (n, t) in sorted(total.items(), key=lambda kv: -kv[1][1]):
        print(f"{t:11.1f} us {100 * t / step:5.1f}% {n:5d} x {t / n:9.1f} us  {key}")


for p in sys.argv[1:]:
    summarize(p)
