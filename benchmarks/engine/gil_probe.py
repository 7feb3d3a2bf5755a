"""GIL probe (issue 7j): how much a record-path-like thread slows a plain training loop in the same process.

One thread trains the digits MLP (8×8 → 128 → 128 → 10, plain SGD, one item per step) back to back for 2 s;
another thread, every 1.1 ms (digits/MLP's 0.5× interval), runs N small torch calls (a Linear forward)
and a busy Python loop of P µs, the shape of the trainer's record path (decode, predict, dispatch,
publish). Both need the GIL for their Python parts; every torch call releases it and must take it back.
Printed: the train step's mean time per configuration, with the default switch interval (5 ms) and 0.5 ms.

    /work/tools/timed .venv/bin/python -m benchmarks.engine.gil_probe
"""

from __future__ import annotations

import sys
import threading
import time

import torch

torch.set_num_threads(1)
model = torch.nn.Sequential(
    torch.nn.Flatten(),
    torch.nn.Linear(64, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 128),
    torch.nn.ReLU(),
    torch.nn.Linear(128, 10),
)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x, y = torch.rand(1, 8, 8), torch.tensor([3])


def step() -> None:
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def trainer(seconds: float) -> float:
    n, began = 0, time.perf_counter()
    while time.perf_counter() < began + seconds:
        step()
        n += 1
    return (time.perf_counter() - began) / n * 1000


def record_path(stop: threading.Event, interval_s: float, torch_calls: int, python_us: float) -> None:
    layer, xs, due = torch.nn.Linear(64, 10), torch.rand(1, 64), time.perf_counter()
    while not stop.is_set():
        due += interval_s
        with torch.no_grad():
            for _ in range(torch_calls):
                layer(xs)
        t = time.perf_counter()
        while time.perf_counter() - t < python_us * 1e-6:
            pass
        if (delay := due - time.perf_counter()) > 0:
            time.sleep(delay)


def main() -> int:
    for _ in range(300):
        step()
    print("| switch interval | record path every 1.1 ms | train step, ms |\n|---|---|---|")
    for switch in (0.005, 0.0005):
        sys.setswitchinterval(switch)
        for calls, py_us in ((0, 0), (10, 100), (30, 200)):
            stop = threading.Event()
            other = threading.Thread(target=record_path, args=(stop, 0.0011, calls, py_us)) if calls else None
            if other is not None:
                other.start()
            ms = trainer(2.0)
            stop.set()
            if other is not None:
                other.join()
            what = f"{calls} torch calls + {py_us} µs Python" if calls else "idle"
            print(f"| {switch * 1000:.1f} ms | {what} | {ms:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
