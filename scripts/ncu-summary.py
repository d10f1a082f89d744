#!/usr/bin/env python3
"""Sums `ncu --csv --metrics gpu__time_duration.sum` output by kernel name.

usage: ncu-summary.py NCU.csv [STEPS]   (STEPS: divide totals by this many model steps)
"""
import csv, sys, collections

rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
cols = rows[head]
name_i, metric_i, value_i = cols.index("Kernel Name"), cols.index("Metric Name"), cols.index("Metric Value")
unit_i = cols.index("Metric Unit")
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}
tot, cnt = collections.Counter(), collections.Counter()
for r in rows[head + 1:]:
    if len(r) <= value_i or r[metric_i] != "gpu__time_duration.sum":
        continue
    name = r[name_i].split("(")[0][:70]
    tot[name] += float(r[value_i].replace(",", "")) * scale.get(r[unit_i], 1.0)
    cnt[name] += 1
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
all_ns = sum(tot.values())
print(f"{'kernel':70s} {'calls':>6s} {'us/step':>9s} {'share':>6s}")
for name, ns in tot.most_common(25):
    print(f"{name:70s} {cnt[name] / steps:6.1f} {ns / 1e3 / steps:9.1f} {100 * ns / all_ns:5.1f}%")
print(f"total kernel time per step: {all_ns / 1e3 / steps:.1f} us")
