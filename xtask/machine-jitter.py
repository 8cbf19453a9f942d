#!/usr/bin/env python3
"""How steady is this machine's CPU? Spins for SECS seconds and counts the
work done in each WINDOW-second window, then prints the slowest windows
relative to the median. Run one per core, on an otherwise idle machine:

    python3 xtask/machine-jitter.py 0.01 8 & python3 xtask/machine-jitter.py 0.01 8; wait

A pipeline held at 70 % of its measured capacity goes over capacity for as
long as the machine runs below 0.7x, and its latency tail shows it
(docs/benchmarks.md, "Latency").
"""
import statistics
import sys
import time

window = float(sys.argv[1]) if len(sys.argv) > 1 else 0.01
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 8.0
end = time.perf_counter() + secs
rates = []
while time.perf_counter() < end:
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() - t0 < window:
        for _ in range(200):
            n += 1
    rates.append(n)
rates.sort()
med = statistics.median(rates)
print(
    f"{len(rates)} windows of {window * 1000:g} ms: "
    f"p1 {rates[len(rates) // 100] / med:.2f}x, p0.1 {rates[len(rates) // 1000] / med:.2f}x, "
    f"slowest {rates[0] / med:.2f}x of the median; "
    f"{sum(r < 0.7 * med for r in rates)} windows under 0.7x"
)
