"""Measured peak memory of every method against its planned bytes (issue 8, Must show).

For mnistnet and convnet (committed profiles) at three budgets — the minimum feasible, halfway, and
unconstrained (the paper's M−, M, M+ of Ferret's planner) — plan Ferret's partition L* and worker slots,
run each method on them (Oracle and 1-Skip on the whole model, Ferret on its plan, every schedule on its
L*) on the virtual clock at the paper's rate (t^d = max_i t̂_i^f), and compare the engine's *measured* peak
(distinct storages it holds + autograd's saved tensors, sampled after every action; independent of any
cost model) with the method's planned bytes: the schedules' and the sequential methods' byte model
(:mod:`ferret_core.planning.schedule_memory`, built from the same per-stage primitives as Ferret's byte
model), and for Ferret its plan's predicted bytes. Every planned figure counts with the engine's byte
model (``variant="engine"``) and no compensator, as the runs apply none. Inputs are random tensors of the
model's input shape (memory does not depend on pixel values).

    .venv/bin/python -m benchmarks.schedules.memory            # → results/memory.{md,json}
    .venv/bin/python -m benchmarks.schedules.memory --items 120 --models mnistnet
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

from benchmarks.support import stream
from ferret_core.engine import METHOD_NAMES, EngineSettings, MethodOptions, StageTimes, StreamEngine, make_policy
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parent / "profiles"
RESULTS = HERE / "results"
MODELS = {"mnistnet": {}, "convnet": {"input_size": 32}}
METHODS = METHOD_NAMES  # every registered method
# what every method's planned bytes count: the engine's byte model (what it allocates), no compensator (the
# runs apply none) — the same settings for Ferret's planner as for the schedules' and the sequential methods'
COUNTED = MemorySettings(variant="engine", compensator="none")
BUDGETS = {"M-": 0.0, "M": 0.5, "M+": None}  # fraction of the way from the minimum feasible to unconstrained


def measure(name: str, budget_name: str, method: str, items: int) -> dict[str, object]:
    # the profile with mini-batch step times (the buffering methods train steps of N items), else the plain one
    batches = PROFILES / f"{name}-batches.json"
    profile = ModelProfile.load(batches if batches.exists() else PROFILES / f"{name}.json")
    planner = Planner(profile, PlannerSettings(memory=COUNTED))
    low, high = planner.min_feasible_bytes, planner.plan(None).planned_bytes
    fraction = BUDGETS[budget_name]
    budget = None if fraction is None else int(low + fraction * (high - low))
    plan = planner.plan(budget)
    model = build_model(name, **MODELS[name])  # type: ignore[arg-type]
    policy = make_policy(method, plan, profile=profile, options=MethodOptions(memory=COUNTED))
    setup = policy.setup(name, model.num_units, plan.arrival_interval)
    engine = StreamEngine(model.units, setup, EngineSettings(keep_trace=False, validate=False))
    times = StageTimes.from_profile(profile, setup.plan.partition)
    result = engine.run_virtual(stream(model.input_shape, model.num_classes, items), times, plan.arrival_interval)
    planned = int(result.planned_bytes or 0)
    measured = int(result.peak_bytes or 0)
    return {
        "model": name,
        "budget": budget_name,
        "budget_bytes": budget,
        "method": method,
        "stages": setup.plan.num_stages,
        "slots": plan.num_workers,
        "rows": setup.plan.num_workers,
        "trained": result.trained,
        "items": result.items,
        "measured_peak_bytes": measured,
        "planned_bytes": planned,
        "measured_over_planned": measured / planned,
        "measured_breakdown": dict(result.memory_breakdown),
        "planned_breakdown": dict(setup.plan.memory_breakdown),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    load_before = os.getloadavg()[0]
    rows = []
    for name in args.models:
        for budget_name in BUDGETS:
            for method in args.methods:
                row = measure(name, budget_name, method, args.items)
                rows.append(row)
                print(
                    f"{name} {budget_name} {method}: P={row['stages']} rows={row['rows']} measured "
                    f"{row['measured_peak_bytes'] / 2**20:.2f} MiB planned {row['planned_bytes'] / 2**20:.2f} MiB "
                    f"ratio {row['measured_over_planned']:.3f}",
                    file=sys.stderr,
                )
    lines = [
        "| model | budget | method | L* stages, slots → rows | trained / items | measured MiB | planned MiB "
        "| measured ÷ planned |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget']} | {r['method']} | {r['stages']}, {r['slots']} → {r['rows']} | "
            f"{r['trained']} / {r['items']} | {int(r['measured_peak_bytes']) / 2**20:.2f} | "  # type: ignore[call-overload]
            f"{int(r['planned_bytes']) / 2**20:.2f} | {float(r['measured_over_planned']):.3f} |"  # type: ignore[call-overload,arg-type]
        )
    worst = max(abs(float(r["measured_over_planned"]) - 1.0) for r in rows)  # type: ignore[arg-type]
    table = "\n".join(lines)
    print(table)
    print(f"worst |measured ÷ planned − 1| = {worst:.3f} (goal ≤ 0.20)")
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        command = "-m benchmarks.schedules.memory " + " ".join(sys.argv[1:])
        header = (
            f"Measured peak vs planned bytes of every method ({args.items} items per run, no compensator; "
            f"planned with the engine byte model, virtual clock at t^d = max t̂^f; load average {load_before:.2f} → "
            f"{os.getloadavg()[0]:.2f}). Command: `.venv/bin/python {command.strip()}`.\n\n"
        )
        (RESULTS / "memory.md").write_text(
            header + table + f"\n\nWorst |measured ÷ planned − 1| = {worst:.3f} (goal ≤ 0.20).\n"
        )
        (RESULTS / "memory.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
