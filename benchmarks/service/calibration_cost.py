"""What calibrating the cost of staleness on the live stream costs the stream it runs beside.

``trainer.objective: accuracy`` without ``trainer.staleness_cost`` calibrates d(τ) on the stream's first
labelled items in a child process at nice +10 (``services/trainer/staleness_live.py``), while the trainer
goes on predicting and training. The obvious alternative is the trainer as shipped (``objective: rate``,
nothing calibrated): the same MNIST/MNISTNet stream, the same rate, in the same run. Per second, from the
trainer's status: items trained (backward passes), the calibration's state; per arm: items trained per
second while the calibration ran and after it, the trainer's and the child's CPU (the machine's CPU minus
the processes measured), online accuracy, the plan before and after. One run per arm and rate, the arms
back to back on the same machine (indicative: other processes on the 2 cores move single runs).

    .venv/bin/python -m benchmarks.service.calibration_cost --rates 150 400 --seconds 60
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.service import harness as h

ARMS = {"rate (as shipped)": {}, "accuracy, calibrated live": {"FERRET_TRAINER_OBJECTIVE": "accuracy"}}


class ObjectiveService(h.Service):
    """The harness's trainer (``ferret run``, MNISTNet, processes where they pay) with ``extra`` settings."""

    def __init__(self, model: str, extra: dict[str, str]) -> None:
        super().__init__(model)
        self.extra = extra

    def trainer_env(self) -> dict[str, str]:
        return {**super().trainer_env(), **self.extra}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out.extend(children)
            todo.extend(children)
    return out


def kind_of(pid: int) -> str:
    """``calibration`` (the spawned child), ``executors`` (the forkserver and its children) or ``other``."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    if "spawn_main" in cmdline:
        return "calibration"
    return "executors" if "forkserver" in cmdline else "other"


class CalibrationSampler(h.Sampler):
    """The harness's per-second samples plus the calibration's state (-1 where there is none) and the CPU
    seconds of the trainer's child processes by kind (each process's last reading, so one that exited
    keeps what it used)."""

    def __init__(self, client: Any, pids: dict[str, int | None], interval: float = 1.0) -> None:
        self.children: dict[int, tuple[str, float]] = {}
        super().__init__(client, pids, interval)

    def more_status(self, status: Any) -> dict[str, float]:
        return {"calibration": status.counters.get("staleness_calibration_state", -1)}

    def take(self) -> h.Sample:
        sample = super().take()
        trainer = self.pids.get("trainer")
        for pid in descendants(trainer) if trainer else []:
            cpu = h.cpu_seconds(pid)
            kind = self.children[pid][0] if pid in self.children else kind_of(pid)
            self.children[pid] = (kind, max(cpu, self.children.get(pid, (kind, 0.0))[1]))
        for kind in ("calibration", "executors"):
            sample.cpu[kind] = sum(c for k, c in self.children.values() if k == kind)
        return sample


def run_arm(name: str, extra: dict[str, str], rate: float, seconds: float) -> dict[str, Any]:
    dataset = h.mnist()
    with ObjectiveService("mnistnet", extra) as service:
        assert service.client is not None
        reader = service.reader()
        sampler = CalibrationSampler(service.client, service.pids)
        try:
            before = json.loads(service.client.get_plan().plan_json)
            result = h.run_stream(service, reader, sampler, dataset, rate=rate, seconds=seconds, stream="measured")
            after = json.loads(service.client.get_plan().plan_json)
            status = service.client.get_status()
        finally:
            sampler.close()
            reader.close()
    samples = sampler.samples
    per_second = [
        (b.status["backward_passes"] - a.status["backward_passes"]) / (b.t - a.t)
        for a, b in itertools.pairwise(samples)
    ]
    states = [int(b.status["calibration"]) for b in samples[1:]]
    measured = [(s, v) for s, v in zip(states, per_second, strict=True)]
    during = [v for s, v in measured if s == 1]
    after_cal = [v for s, v in measured if s == 2]
    return {
        "arm": name,
        "rate": rate,
        "trained_per_s": result.trained_per_s,
        "trained_per_s_while_calibrating": statistics.fmean(during) if during else None,
        "seconds_calibrating": len(during),
        "trained_per_s_after": statistics.fmean(after_cal) if after_cal else None,
        "online_accuracy": status.online_accuracy,
        "cpu": result.cpu,
        "plan_before": f"{before['num_stages']} × {before['live_workers']}",
        "plan_after": f"{after['num_stages']} × {after['live_workers']}",
        "objective_after": (after.get("objectives") or {}).get("objective", "rate"),
        "per_second": [{"state": s, "trained": round(v, 1)} for s, v in measured],
        "stream": result.as_dict(),
    }


def fmt(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def same_seconds(base: dict[str, Any], row: dict[str, Any]) -> float | None:
    """The trainer as shipped: items trained per second over the seconds (from its start) in which ``row``'s
    trainer was calibrating (None where it never was)."""
    ours = row["per_second"]
    theirs = [p["trained"] for p in base["per_second"]]
    seconds = [i for i in range(min(len(ours), len(theirs))) if ours[i]["state"] == 1]
    return statistics.fmean(theirs[i] for i in seconds) if seconds and row is not base else None


def render(rows: list[dict[str, Any]], head: str) -> str:
    lines = [
        "# The staleness cost calibrated live: what it costs the stream\n",
        head,
        "| rate, items/s | arm | trained/s (whole stream) | ÷ as shipped | trained/s while calibrating (s) "
        "| as shipped, the same seconds | trained/s after | online accuracy % "
        "| cores: record path / executors / calibration / broker / machine | plan before → after |",
        "|---:|---|---:|---:|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        base = next(r for r in rows if r["rate"] == row["rate"] and r["arm"] == next(iter(ARMS)))
        ratio = row["trained_per_s"] / base["trained_per_s"] if base["trained_per_s"] else float("nan")
        cpu = row["cpu"]
        lines.append(
            f"| {row['rate']:g} | {row['arm']} | {row['trained_per_s']:.1f} | {ratio:.2f}× "
            f"| {fmt(row['trained_per_s_while_calibrating'])} ({row['seconds_calibrating']}) "
            f"| {fmt(same_seconds(base, row))} | {fmt(row['trained_per_s_after'])} | {row['online_accuracy']:.1f} "
            f"| {cpu.get('trainer', 0):.2f} / {cpu.get('executors', 0):.2f} / {cpu.get('calibration', 0):.2f} "
            f"/ {cpu.get('broker', 0):.2f} / {cpu.get('machine_busy', 0):.2f} "
            f"| {row['plan_before']} → {row['plan_after']} ({row['objective_after']}) |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[150.0, 400.0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--out", default="calibration_cost")
    args = parser.parse_args()
    rows = []
    for rate in args.rates:
        for name, extra in ARMS.items():
            began = time.monotonic()
            rows.append(run_arm(name, extra, rate, args.seconds))
            print(f"{rate:g}/s {name}: {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    head = (
        f"Command: `python -m benchmarks.service.calibration_cost {' '.join(sys.argv[1:])}` (commit {h.git_head()}); "
        f"MNIST/MNISTNet, {args.seconds:g} s per stream, one run per cell; machine: {json.dumps(h.machine())}.\n"
    )
    markdown = render(rows, head)
    print(markdown)
    h.write_results(args.out, {"rows": rows, "machine": h.machine()}, markdown)


if __name__ == "__main__":
    main()
