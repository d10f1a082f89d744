#!/usr/bin/env python3
"""Sums `ncu --csv` output (gpu__time_duration.sum, optionally dram__bytes_read/write.sum) by
kernel name and grid size, so the products of one decode step show apart (q|k|v, o, gate|up,
down and the LM head have different grids).

usage: ncu-summary.py NCU.csv [STEPS]   (STEPS: divide totals by this many model steps, or "auto")
"""
import csv, sys, collections

rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
cols = rows[head]
idx = {c: cols.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Value", "Metric Unit")}
grid_i = cols.index("Grid Size") if "Grid Size" in cols else None
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}
per_launch = collections.defaultdict(dict)  # ID -> {key, metric: value}
for r in rows[head + 1:]:
    if len(r) <= idx["Metric Value"]:
        continue
    name = r[idx["Kernel Name"]].split("(")[0][:60]
    grid = r[grid_i] if grid_i is not None else ""
    d = per_launch[r[idx["ID"]]]
    d["key"] = (name, grid)
    d[r[idx["Metric Name"]]] = float(r[idx["Metric Value"]].replace(",", "")) * scale.get(r[idx["Metric Unit"]], 1.0)
tot, cnt, byts = collections.Counter(), collections.Counter(), collections.Counter()
for d in per_launch.values():
    k = d["key"]
    tot[k] += d.get("gpu__time_duration.sum", 0.0)
    byts[k] += d.get("dram__bytes_read.sum", 0.0) + d.get("dram__bytes_write.sum", 0.0)
    cnt[k] += 1
# STEPS "auto": the launches of the embedding gather, one a decode step (the window's edges may
# cut a step, so per-step figures are within one step's worth).
if len(sys.argv) > 2 and sys.argv[2] == "auto":
    steps = float(sum(c for k, c in cnt.items() if "embedding" in k[0])) or 1.0
    print(f"steps in the window (embedding launches): {steps:.0f}")
else:
    steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
all_ns = sum(tot.values())
print(f"{'kernel':60s} {'grid':>16s} {'calls':>6s} {'us/call':>8s} {'us/step':>8s} {'share':>6s} {'MB/call':>8s} {'TB/s':>5s}")
for k, ns in tot.most_common(30):
    c = cnt[k]
    bw = byts[k] / ns / 1e3 if ns else 0.0  # bytes per ns = GB/s; / 1e3 = TB/s
    print(f"{k[0]:60s} {k[1]:>16s} {c / steps:6.1f} {ns / c / 1e3:8.2f} {ns / 1e3 / steps:8.1f} "
          f"{100 * ns / all_ns:5.1f}% {byts[k] / c / 1e6:8.2f} {bw:5.2f}")
print(f"total kernel time per step: {all_ns / 1e3 / steps:.1f} us, DRAM bytes per step: {sum(byts.values()) / steps / 1e6:.1f} MB")
