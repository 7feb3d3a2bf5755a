"""Planned against measured memory of process plans, and what measuring it costs, in one run.

For each plan (N workers × P stages of a zoo model as executor processes, :class:`ProcessClock`), the
same stream of real items paced at ``--rate-factor`` × the plain loop's capacity (so executors are
saturated and items overlap in the pipeline), two arms interleaved in each repeat:

* **measured** (``ProcessSettings(measure_memory=True)``, the default): every executor samples what it
  holds after each action (:mod:`ferret_core.engine.memory_meter`, the shared slots and rings excluded);
  reported: the byte model's planned bytes (``MemorySettings(executors="processes")``, the compensator's),
  :meth:`ProcessClock.measured_bytes` = the shared segments + Σ executor peaks, each executor's peak and
  its largest sources, and the sampling's own CPU time per action (inside the executors, the sampling
  thread's CPU time: other processes on the cores do not inflate it);
* **not measured** (``measure_memory=False``): no meter, no saved-tensor hooks: the obvious alternative,
  so *measured ÷ not measured* trained items/s in the same repeat is what sampling costs the executors.

Medians over repeats; one torch thread per executor.

    flock /tmp/ferret-bench.lock .venv/bin/python -m benchmarks.distributed.memory
    # → results/memory.{md,json}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.distributed.throughput import (
    CASES,
    Warm,
    balanced_cut,
    load_items,
    paced,
    plain_capacity,
    setup_of,
    units_of,
)
from benchmarks.support import run_record, write_result
from ferret_core.engine.policies import sequential_plan
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.plan import Partition, Plan, WorkerConfig
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.profile import ModelProfile
from services.config.data_root import default_data_root

RESULTS = Path(__file__).resolve().parent / "results"
PROFILES = Path(__file__).resolve().parents[1] / "profiles"

# name: (workers, stages, T1, c^a, compensator)
PLANS: dict[str, tuple[int, int, bool, int, str]] = {
    "1 × 1": (1, 1, False, 1, "none"),
    "2 × 1": (2, 1, False, 1, "none"),
    "1 × 2": (1, 2, False, 1, "none"),
    "1 × 2, T1": (1, 2, True, 1, "none"),
    "2 × 1, T2 (c^a = 2), iter-fisher": (2, 1, False, 2, "iter-fisher"),
}


def plan_for(model: str, units: list[nn.Module], interval: float, name: str, cut: tuple[int, int, int]) -> Plan:
    workers, stages, recompute, accumulation, _ = PLANS[name]
    plan = sequential_plan(model, len(units), interval)
    partition = Partition(cut if stages == 2 else (0, len(units)))
    p = partition.num_stages
    return dataclasses.replace(
        plan,
        partition=partition,
        workers=tuple(
            WorkerConfig(n, live=True, recompute=recompute, accumulation=(accumulation,) * p, omission=(0,) * p)
            for n in range(workers)
        ),
    )


def arm(
    units: list[nn.Module], plan: Plan, xs: list[torch.Tensor], ys: list[int], lr: float, rate: float,
    compensator: str, measure_memory: bool, warm: Warm,
) -> dict[str, Any]:
    settings = ProcessSettings(
        lr=lr, compensator=compensator, keep_trace=False, flush_denormal=True, measure_memory=measure_memory
    )
    with ProcessClock(units, setup_of(plan), settings) as clock:
        for x, y in zip(*warm, strict=True):  # every executor's first actions (kernels, allocator), untimed
            clock.submit(x, y)
            clock.drain(60)
        base = {(u.worker, u.stage): u for u in clock.usage()}
        trained = 0

        def submit(batch_x: list[torch.Tensor], batch_y: list[int]) -> None:
            nonlocal trained
            trained += sum(a.skipped is None for a in clock.submit_many(batch_x, list(batch_y)))

        t0 = paced(submit, xs, ys, rate)
        clock.drain(300)
        elapsed = time.perf_counter() - t0
        usage = {(u.worker, u.stage): u for u in clock.usage()}
        measured, shared = clock.measured_bytes(), clock.shared_bytes()
    executors = {
        f"{n}/{j}": {
            "peak_bytes": u.measured_bytes,
            "breakdown": u.measured_breakdown,
            "cpu_s": u.cpu_seconds - base[(n, j)].cpu_seconds,
            "actions": u.actions - base[(n, j)].actions,
            "samples": u.memory_samples - base[(n, j)].memory_samples,
            "sample_s": u.sample_seconds - base[(n, j)].sample_seconds,
        }
        for (n, j), u in sorted(usage.items())
    }
    return {
        "trained": trained,
        "elapsed_s": elapsed,
        "per_s": trained / elapsed,
        "measured_bytes": measured,
        "shared_bytes": shared,
        "executors": executors,
    }


def measure(
    model: str, items: int, warm: int, repeats: int, factor: float, root: Path, names: list[str]
) -> dict[str, Any]:
    dataset, kwargs, lr = CASES[model]
    profile = ModelProfile.load(PROFILES / f"{model}.json")
    xs, ys = load_items(dataset, items + warm, root)
    units = units_of(model, kwargs)
    plain_capacity(units, xs[:warm], ys[:warm], lr, 1)  # warm-up: kernels, allocator
    cut = balanced_cut(units, xs[0])
    warm_items = (xs[:4], ys[:4])
    xs, ys = xs[warm:], ys[warm:]
    rows: dict[str, dict[str, list[dict[str, Any]]]] = {name: {"on": [], "off": []} for name in names}
    planned: dict[str, dict[str, Any]] = {}
    capacities = []
    for _ in range(repeats):
        cap = plain_capacity(units, xs, ys, lr, 1)
        capacities.append(cap["trained"] / cap["elapsed_s"])
        rate = factor * capacities[-1]
        for k, name in enumerate(names):
            compensator = PLANS[name][4]
            plan = plan_for(model, units, 1.0 / rate, name, cut)
            memory = MemoryModel.for_plan(plan, profile, MemorySettings(executors="processes", compensator=compensator))
            planned[name] = {"total": memory.total(plan.workers), "breakdown": memory.breakdown(plan.workers)}
            for key in ("on", "off") if (k + len(capacities)) % 2 else ("off", "on"):  # alternate who goes first
                rows[name][key].append(arm(units, plan, xs, ys, lr, rate, compensator, key == "on", warm_items))
            print(json.dumps({name: [round(rows[name][k][-1]["per_s"], 1) for k in ("on", "off")]}), flush=True)
    return {"model": model, "dataset": dataset, "items": items, "lr": lr, "cut": list(cut),
            "plain_capacity_per_s": capacities, "planned": planned, "arms": rows}


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f}"


def tables(res: dict[str, Any]) -> str:
    lines = [
        "| plan | planned KiB | measured KiB (max over repeats) | measured ÷ planned | shared KiB | "
        "executor peaks KiB (worker/stage) | largest sources at the peak |",
        "|---|---:|---:|---:|---:|---|---|",
    ]
    for name, arms in res["arms"].items():
        on = arms["on"]
        worst = max(on, key=lambda r: r["measured_bytes"])
        planned = res["planned"][name]["total"]
        peaks = ", ".join(f"{e}: {_kib(x['peak_bytes'])}" for e, x in worst["executors"].items())
        sources = "; ".join(
            f"{e}: " + ", ".join(
                f"{k} {_kib(v)}" for k, v in sorted(x["breakdown"].items(), key=lambda kv: -kv[1])[:2] if v
            )
            for e, x in worst["executors"].items()
        )
        lines.append(
            f"| {name} | {_kib(planned)} | {_kib(worst['measured_bytes'])} | "
            f"{worst['measured_bytes'] / planned:.3f} | {_kib(worst['shared_bytes'])} | {peaks} | {sources} |"
        )
    lines += [
        "",
        "| plan | trained items/s, not measured | measured | measured ÷ not measured (same repeat) | "
        "executor CPU ms / trained item, not measured | measured | sampling µs / action | samples / action | "
        "sampling share of executor CPU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, arms in res["arms"].items():
        on, off = arms["on"], arms["off"]
        ratio = _median([a["per_s"] / b["per_s"] for a, b in zip(on, off, strict=True)])

        def total(row: dict[str, Any], key: str) -> float:
            return float(sum(x[key] for x in row["executors"].values()))

        per_action = _median([total(r, "sample_s") / max(1.0, total(r, "actions")) for r in on])
        samples = _median([total(r, "samples") / max(1.0, total(r, "actions")) for r in on])
        share = _median([total(r, "sample_s") / max(1e-9, total(r, "cpu_s")) for r in on])
        cpu_off = _median([total(r, "cpu_s") / max(1, r["trained"]) for r in off])
        cpu_on = _median([total(r, "cpu_s") / max(1, r["trained"]) for r in on])
        lines.append(
            f"| {name} | {_median([r['per_s'] for r in off]):.1f} | {_median([r['per_s'] for r in on]):.1f} | "
            f"{ratio:.2f}× | {1e3 * cpu_off:.2f} | {1e3 * cpu_on:.2f} | {1e6 * per_action:.0f} | {samples:.2f} | "
            f"{100 * share:.1f} % |"
        )
    return "\n".join(lines)


def render(result: dict[str, Any], args: argparse.Namespace) -> str:
    res = result["result"]
    return (
        f"# Planned vs measured memory of process plans: {res['model']} / {res['dataset']}, "
        f"{args.rate_factor:g}× the plain loop's capacity\n\n"
        f"Command: `{result['command']}` at {result['commit']}; {result['cpus']} CPUs, load before "
        f"{result['load_before'][0]:.2f}; medians of {args.repeats} repeats of {res['items']} items (plain loop "
        f"capacity {_median(res['plain_capacity_per_s']):.0f} items/s); 2-stage cut {res['cut']}. Other "
        f"engineers' tests may have shared the CPU.\n\n{tables(res)}\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mnistnet", choices=list(CASES))
    parser.add_argument("--items", type=int, default=1500)
    parser.add_argument("--warm", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rate-factor", type=float, default=2.0, help="stream rate ÷ the plain loop's capacity")
    parser.add_argument("--data-root", type=Path, default=None)
    parser.add_argument("--plans", nargs="*", default=list(PLANS), choices=list(PLANS), metavar="PLAN")
    parser.add_argument("--out", default="memory")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    load = os.getloadavg()
    root = args.data_root or default_data_root()
    res = measure(args.model, args.items, args.warm, args.repeats, args.rate_factor, root, args.plans)
    print(tables(res), flush=True)
    result = run_record("benchmarks.distributed.memory", argv, load, result=res)
    write_result(RESULTS, args.out, result, lambda r: render(r, args))
    print(json.dumps({"written": str(RESULTS / args.out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
