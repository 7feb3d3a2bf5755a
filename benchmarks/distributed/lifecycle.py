"""A process clock's life cycle: start-up, re-plans that keep the processes, and a kill -9.

For each repeat: start a :class:`~ferret_core.engine.processes.ProcessClock` (1 stage × N workers,
MNISTNet); train some items; re-plan three times on the running executors (T2 changed on every worker:
configure only; the last worker removed, T4; brought back: a process started) and time each from the
drained pipeline to the new plan in force; stream items at about the clock's capacity, ``kill -9`` one
executor process mid-stream, and measure the time from the kill to the caller's first
:class:`~ferret_core.errors.ScheduleError` and to every executor process gone. Start-up is timed for the
first clock of the run (which starts the forkserver and imports torch there) and for the later ones.

    .venv/bin/python -m benchmarks.distributed.lifecycle               # → results/lifecycle.{md,json}
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.distributed.throughput import load_items, setup_for, setup_of, units_of
from benchmarks.support import short_head, write_result
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.errors import ScheduleError
from services.config.data_root import default_data_root

RESULTS = Path(__file__).resolve().parent / "results"


def replans(clock: ProcessClock, units: list[Any], workers: int) -> dict[str, float]:
    """Seconds of three re-plans on the running executors."""
    base = setup_for("mnistnet", len(units), workers, 0.004)
    accumulate = dataclasses.replace(
        base.plan, workers=tuple(dataclasses.replace(w, accumulation=(2,)) for w in base.plan.workers)
    )
    removed = dataclasses.replace(
        base.plan, workers=(*base.plan.workers[:-1], dataclasses.replace(base.plan.workers[-1], live=False))
    )
    return {
        "replan_configure_s": clock.replan(setup_of(accumulate)),
        "replan_remove_worker_s": clock.replan(setup_of(removed)),
        "replan_add_worker_s": clock.replan(setup_of(base.plan)),
    }


def one_kill(units: list[Any], xs: list[torch.Tensor], ys: list[int], workers: int) -> dict[str, float]:
    setup = setup_for("mnistnet", len(units), workers, 0.004)
    clock = ProcessClock(units, setup, ProcessSettings(lr=0.02, keep_trace=False))
    clock.start()
    start_s = clock.start_seconds
    for x, y in zip(xs[:10], ys[:10], strict=True):
        clock.submit(x, y)
        clock.drain(30)
    timings = replans(clock, units, workers)
    victim = clock._processes[(workers - 1, 0)]
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
    return {"start_s": start_s, **timings, "kill_to_error_s": raised - killed, "kill_to_all_gone_s": gone - killed}


def _column(rows: list[dict[str, float]], key: str) -> list[float]:
    return [r[key] for r in rows]


def _ms(values: list[float]) -> str:
    return f"{1000 * statistics.median(values):.1f} ms | {1000 * max(values):.1f} ms"


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    first, later = rows[0]["start_s"], [r["start_s"] for r in rows[1:]]
    errors = [r["kill_to_error_s"] for r in rows]
    gone = [r["kill_to_all_gone_s"] for r in rows]
    return (
        "# Process executors: start-up, re-plans that keep the processes, a kill -9 mid-stream\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs; 1 stage × "
        f"{result['workers']} workers, MNISTNet; {len(rows)} repeats.\n\n"
        "| measure | median | max |\n|---|---:|---:|\n"
        f"| kill -9 → the caller's ScheduleError | {_ms(errors)} |\n"
        f"| kill -9 → every executor process gone | {_ms(gone)} |\n"
        f"| start-up, first clock of the process (forkserver + torch import) | {first:.3f} s | |\n"
        f"| start-up, later clocks | {1000 * statistics.median(later):.1f} ms | {1000 * max(later):.1f} ms |\n"
        f"| re-plan, T2 changed on every worker (configure) | {_ms(_column(rows, 'replan_configure_s'))} |\n"
        f"| re-plan, a worker removed (T4: its process retired) | {_ms(_column(rows, 'replan_remove_worker_s'))} |\n"
        f"| re-plan, the worker back (a process started) | {_ms(_column(rows, 'replan_add_worker_s'))} |\n"
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
        "command": " ".join([".venv/bin/python", "-m", "benchmarks.distributed.lifecycle", *(argv or sys.argv[1:])]),
        "commit": short_head(),
        "cpus": os.cpu_count(),
        "workers": args.workers,
        "rows": rows,
    }
    print(write_result(RESULTS, "lifecycle", result, render))
    return 0


if __name__ == "__main__":
    sys.exit(main())
