"""Measured peak memory of the buffering methods and the OCL algorithms versus their planned bytes.

(a) ``random-n``, ``last-n`` and ``camel`` on mnistnet and convnet at three budgets: the smallest that fits
(N = 1's bytes, which also fit every N whose step is smaller than the gradient), the middle, and the bytes
of the largest profiled step (N = 50; Camel: N + R = 50). Each policy fits its mini-batch N to the budget
(:func:`ferret_core.engine.buffering.fit_batch`); its plan reports
:func:`~ferret_core.engine.buffering.buffering_bytes`.
(b) every OCL algorithm under ``last-n`` (N = 10) and under ``ferret`` (the planner's unconstrained plan
for the algorithm's step, paper memory model + extras as ``ferret simulate`` plans by default; the
``engine`` model's bytes for the same configuration beside it; no compensation, whose state is not what
is compared here). LwF's teacher and MAS's importances are refreshed every 50 items so that their state
exists within the run; a Ferret run streams at least 4 items per worker slot so that every worker's
replica and stashes are in their steady state.

Each run streams ``ITEMS`` random inputs of the model's shape (memory does not depend on pixel values)
on the virtual clock at t^d = max t̂^f of the batch profiles; the engine's *measured* peak (distinct
storages it holds + autograd's saved tensors, sampled after every action) never reads a cost model.

    .venv/bin/python -m benchmarks.methods.memory            # → results/memory.{md,json}
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

from benchmarks.support import stream
from ferret_core.engine import EngineSettings, FerretPolicy, simulate
from ferret_core.engine.buffering import BUFFERING_METHODS, BufferingPolicy, BufferingSettings, buffering_bytes
from ferret_core.ocl import ALGORITHM_NAMES, AlgorithmSettings, make_algorithm
from ferret_core.ocl.planning import planning_memory, planning_profile
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parent / "profiles"
RESULTS = HERE / "results"
MODELS = ("mnistnet", "convnet")
ITEMS = 300
LARGEST = 50  # the largest profiled batch size
COMMAND = ".venv/bin/python -m benchmarks.methods.memory"


ALGORITHMS = AlgorithmSettings(lwf_every=50, mas_every=50)


def run(name: str, profile: ModelProfile, policy: Any, algorithm: str, items: int) -> Any:
    model = build_model(name, num_classes=10)
    settings = EngineSettings(compensator="none", keep_trace=False, validate=False)
    return simulate(model.units, policy, stream(model.input_shape, 10, items), model=name, profile=profile,
                    arrival_interval=profile.max_forward_time, settings=settings,
                    algorithm=make_algorithm(algorithm, ALGORITHMS))


def buffering_rows(name: str, profile: ModelProfile) -> list[dict[str, Any]]:
    rows = []
    for method in BUFFERING_METHODS:
        largest = BufferingSettings(batch=LARGEST // 2 if method == "camel" else LARGEST, window=LARGEST)
        low = buffering_bytes(profile, method, dataclasses.replace(largest, batch=1))
        high = buffering_bytes(profile, method, largest)
        for label, budget in (("low", low), ("mid", (low + high) // 2), ("high", high)):
            policy = BufferingPolicy(method, largest, profile=profile, budget=budget)
            result = run(name, profile, policy, "vanilla", ITEMS)
            rows.append(_row(name, method, "vanilla", label, budget, policy.settings.batch, result))
    return rows


def algorithm_rows(name: str, profile: ModelProfile) -> list[dict[str, Any]]:
    rows = []
    for algorithm in ALGORITHM_NAMES:
        footprint = make_algorithm(algorithm, ALGORITHMS).footprint
        policy = BufferingPolicy("last-n", BufferingSettings(), profile=profile, footprint=footprint)
        rows.append(_row(name, "last-n", algorithm, "default", None, 10, run(name, profile, policy, algorithm, ITEMS)))
        shape = make_algorithm(algorithm, ALGORITHMS).steady_shape(1)
        memory = planning_memory(MemorySettings(compensator="none"), footprint, shape)
        step_profile = planning_profile(profile, shape)
        plan = Planner(step_profile, PlannerSettings(arrival_interval=profile.max_forward_time, memory=memory)).plan()
        result = run(name, profile, FerretPolicy(plan), algorithm, max(ITEMS, 4 * plan.num_workers))
        row = _row(name, "ferret", algorithm, "M+", None, None, result)
        geometry = StageGeometry.from_profile(step_profile, plan.partition)
        engine_bytes = MemoryModel(geometry, step_profile, dataclasses.replace(memory, variant="engine")).total(
            plan.workers
        )
        row.update(plan=f"{plan.num_stages} × {plan.live_workers}/{plan.num_workers}", engine_bytes=engine_bytes,
                   measured_over_engine=row["measured_peak_bytes"] / engine_bytes)
        rows.append(row)
    return rows


def _row(name: str, method: str, algorithm: str, budget_label: str, budget: int | None, batch: int | None,
         result: Any) -> dict[str, Any]:
    measured, planned = int(result.peak_bytes or 0), int(result.planned_bytes or 0)
    print(f"{name} {method} {algorithm} {budget_label}: measured {measured / 2**20:.2f} MiB, "
          f"planned {planned / 2**20:.2f} MiB", file=sys.stderr, flush=True)
    return {
        "model": name, "method": method, "algorithm": algorithm, "budget": budget_label, "budget_bytes": budget,
        "batch": batch, "measured_peak_bytes": measured, "planned_bytes": planned,
        "measured_over_planned": measured / planned, "measured_breakdown": dict(result.memory_breakdown),
        "trained": result.trained, "items": result.items,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model | method | algorithm | budget | N | measured MiB | planned MiB | measured ÷ planned "
        "| engine-model MiB (ferret) | measured ÷ engine model |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        engine = r.get("engine_bytes")
        method = r["method"] + (" " + r["plan"] if "plan" in r else "")
        budget = r["budget"] if r["budget_bytes"] is None else f"{r['budget']} ({r['budget_bytes'] / 2**20:.2f} MiB)"
        batch = "–" if r["batch"] is None else str(r["batch"])
        engine_mib = "–" if engine is None else f"{engine / 2**20:.2f}"
        engine_ratio = "–" if engine is None else f"{r['measured_over_engine']:.2f}"
        lines.append(
            f"| {r['model']} | {method} | {r['algorithm']} | {budget} | {batch} | "
            f"{r['measured_peak_bytes'] / 2**20:.2f} | {r['planned_bytes'] / 2**20:.2f} | "
            f"{r['measured_over_planned']:.2f} | {engine_mib} | {engine_ratio} |"
        )
    ratios = [r["measured_over_planned"] for r in rows]
    lines += ["", f"measured ÷ planned over all rows: {min(ratios):.2f}–{max(ratios):.2f} (goal: within ±20 %)."]
    return "\n".join(lines)


def main() -> int:
    global ITEMS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=ITEMS, help=f"items per run (default {ITEMS})")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default results/)")
    args = parser.parse_args()
    ITEMS = args.items
    results = args.out
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    results.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for name in MODELS:
        profile = ModelProfile.load(PROFILES / f"{name}-batches.json")
        rows += buffering_rows(name, profile)
        rows += algorithm_rows(name, profile)
    text = table(rows)
    print(text)
    header = (
        f"Measured peak vs planned bytes ({ITEMS} random items per run, virtual clock at t^d = max t̂^f of "
        f"benchmarks/profiles/<model>-batches.json; load average {load_before:.2f} → {os.getloadavg()[0]:.2f}). "
        f"Command: `{COMMAND}`.\n\n"
    )
    (results / "memory.md").write_text(header + text + "\n")
    summary = {"command": COMMAND, "items": ITEMS, "rows": rows}
    (results / "memory.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
