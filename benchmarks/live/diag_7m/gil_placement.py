# ruff: noqa  # issue 7m diagnosis scripts, kept as they ran (results/diag-7m.md)
"""GIL hand-over cost by thread placement: gil_probe.py's MLP trainer + record-path-like thread (every 2.3 ms,
N torch calls + P us Python), with the two threads on one CPU, on two CPUs, or unpinned."""

import os
import threading
import time

import torch

# the same digits-MLP step and record-path-like thread (gil_probe sets one torch thread)
from benchmarks.engine import gil_probe
from benchmarks.engine.gil_probe import step


def ctx():
    d = {}
    for line in open(f"/proc/self/task/{threading.get_native_id()}/status"):
        if "ctxt" in line:
            k, v = line.split(":")
            d[k.split("_")[0]] = int(v)
    return d


def trainer(seconds, cpus):
    if cpus:
        os.sched_setaffinity(0, cpus)
    n, c0, t0, s0 = 0, time.thread_time(), time.perf_counter(), ctx()
    while time.perf_counter() < t0 + seconds:
        step()
        n += 1
    s1 = ctx()
    return (
        (time.perf_counter() - t0) / n * 1000,
        (time.thread_time() - c0) / n * 1000,
        (s1["voluntary"] - s0["voluntary"]) / n,
        (s1["nonvoluntary"] - s0["nonvoluntary"]) / n,
    )


def record_path(stop, interval_s, calls, py_us, cpus):
    if cpus:
        os.sched_setaffinity(0, cpus)
    gil_probe.record_path(stop, interval_s, calls, py_us)


for _ in range(300):
    step()
print(os.getloadavg())
print(
    "| placement (trainer / other) | other | step wall ms | step CPU ms | vol cs/step | nonvol cs/step |\n|---|---|---|---|---|---|"
)
all_cpus = os.sched_getaffinity(0)
for rnd in range(2):
    for name, tc, oc in (
        ("unpinned", None, None),
        ("same CPU 0/0", {0}, {0}),
        ("split 0/1", {0}, {1}),
        ("same CPU 1/1", {1}, {1}),
    ):
        for calls, py in ((0, 0), (30, 300)):
            stop = threading.Event()
            other = threading.Thread(target=record_path, args=(stop, 0.0023, calls, py, oc)) if calls else None
            if other:
                other.start()
            res = [None]
            t = threading.Thread(target=lambda: res.__setitem__(0, trainer(1.5, tc)))
            t.start()
            t.join()
            stop.set()
            if other:
                other.join()
            w, c, v, nv = res[0]
            print(
                f"| {name} | {'%d calls + %d us' % (calls, py) if calls else 'idle'} | {w:.3f} | {c:.3f} | {v:.2f} | {nv:.2f} |",
                flush=True,
            )
print(os.getloadavg())
