#!/usr/bin/env python3
"""Per-step GPU time by kernel from ncu's CSV (bench/gpu_profile.sh).

The launches profiled need not start on a step boundary: the number of
steps is the launch count of the cross-entropy forward kernel (one launch
per step and micro-batch); without one, of the kernel seen least often
among those that run at least twice.
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)        # argument list
    name = re.sub(r"<.*", "", name)         # template arguments
    return name.replace("void ", "").strip()


def main(path):
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]
    rows = list(csv.DictReader(lines))
    total = defaultdict(float)
    count = defaultdict(int)
    full = {}
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        k = short(r["Kernel Name"])
        ns = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        ns *= {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        total[k] += ns
        count[k] += 1
        full.setdefault(k, r["Kernel Name"][:160])
    if not total:
        print("no kernels in", path)
        return 1
    once = [k for k in count if "xent_fwd" in k]
    steps = count[once[0]] if once else min(c for c in count.values() if c >= 2)
    steps = max(steps, 1)
    grand = sum(total.values())
    print(f"{len(rows)} launches, {steps} step(s), {grand / steps / 1e6:.2f} ms of kernel time per step")
    print(f"{'ms/step':>8} {'share':>6} {'calls/step':>10}  kernel")
    for k, ns in sorted(total.items(), key=lambda kv: -kv[1]):
        print(f"{ns / steps / 1e6:8.3f} {100 * ns / grand:5.1f}% {count[k] / steps:10.1f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
