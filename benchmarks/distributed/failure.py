"""How fast a killed executor process stops a process clock, and what starting executors costs.

For each repeat: start a :class:`~ferret_core.engine.processes.ProcessClock` (1 stage × N workers,
MNISTNet), stream items at about its capacity, ``kill -9`` one executor process mid-stream, and measure
(a) the time from the kill to the caller's first :class:`~ferret_core.errors.ScheduleError` and (b) to
every executor process gone. Start-up is timed for the first clock of the run (which starts the
forkserver and imports torch there) and for the later ones (a fork of the preloaded server).

    .venv/bin/python -m benchmarks.distributed.failure                 # → results/failure.{md,json}
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.distributed.throughput import load_items, setup_for, units_of
from benchmarks.support import short_head, write_result
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.errors import ScheduleError
from services.config.data_root import default_data_root

RESULTS = Path(__file__).resolve().parent / "results"


def one_kill(units: list[Any], xs: list[torch.Tensor], ys: list[int], workers: int) -> dict[str, float]:
    setup = setup_for("mnistnet", len(units), workers, 0.004)
    clock = ProcessClock(units, setup, ProcessSettings(lr=0.02, keep_trace=False))
    clock.start()
    start_s = clock.start_seconds
    victim = clock._processes[workers - 1]
    killed = raised = gone = float("nan")
    try:
        for k, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if k == len(xs) // 2:
                os.kill(victim.pid, signal.SIGKILL)
                killed = time.perf_counter()
            try:
                clock.submit(x, y)
            except ScheduleError:
                raised = time.perf_counter()
                break
            time.sleep(0.004)
        if raised != raised:  # the stream ended first: the drain reports it
            try:
                clock.drain(10)
            except ScheduleError:
                raised = time.perf_counter()
    finally:
        clock.close(reraise=False)
    deadline = time.perf_counter() + 10
    while any(p.is_alive() for p in clock._processes.values()) and time.perf_counter() < deadline:
        time.sleep(0.005)
    gone = time.perf_counter()
    return {"start_s": start_s, "kill_to_error_s": raised - killed, "kill_to_all_gone_s": gone - killed}


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.1f} ms | {1000 * max(values):.1f} ms"


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    first, later = rows[0]["start_s"], [r["start_s"] for r in rows[1:]]
    errors = [r["kill_to_error_s"] for r in rows]
    gone = [r["kill_to_all_gone_s"] for r in rows]
    return (
        "# Process executors: a kill -9 mid-stream, and start-up\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs; 1 stage × "
        f"{result['workers']} workers, MNISTNet; {len(rows)} repeats.\n\n"
        "| measure | median | max |\n|---|---:|---:|\n"
        f"| kill -9 → the caller's ScheduleError | {_ms(errors)} |\n"
        f"| kill -9 → every executor process gone | {_ms(gone)} |\n"
        f"| start-up, first clock of the process (forkserver + torch import) | {first:.3f} s | |\n"
        f"| start-up, later clocks | {1000 * statistics.median(later):.1f} ms | {1000 * max(later):.1f} ms |\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--items", type=int, default=120)
    parser.add_argument("--data-root", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    xs, ys = load_items("mnist", args.items, args.data_root or default_data_root())
    units = units_of("mnistnet", {})
    rows = [one_kill(units, xs, ys, args.workers) for _ in range(args.repeats)]
    result = {
        "command": " ".join([".venv/bin/python", "-m", "benchmarks.distributed.failure", *(argv or sys.argv[1:])]),
        "commit": short_head(),
        "cpus": os.cpu_count(),
        "workers": args.workers,
        "rows": rows,
    }
    print(write_result(RESULTS, "failure", result, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())
