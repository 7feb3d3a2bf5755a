# ruff: noqa  # issue 7m diagnosis scripts, kept as they ran (results/diag-7m.md)
"""Host-speed canary: the plain digits-MLP step (one thread, nothing else in the process), mean per 0.5-s window."""

import os, time, torch

from benchmarks.engine.gil_probe import step  # the same digits-MLP step (gil_probe sets one torch thread)


for _ in range(300):
    step()
print(os.getloadavg())
out = []
for w in range(40):
    n, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() < t0 + 0.5:
        step()
        n += 1
    out.append(
        (
            (time.perf_counter() - t0) / n * 1000,
            (time.thread_time() - c0) / n * 1000,
            int(open("/proc/thread-self/stat").read().rsplit(")", 1)[1].split()[36]),
        )
    )
print(" ".join(f"{w:.2f}/{c:.2f}@{cpu}" for w, c, cpu in out))
ws = sorted(w for w, _, _ in out)
print("min %.3f median %.3f max %.3f ms" % (ws[0], ws[20], ws[-1]))
print(os.getloadavg())
