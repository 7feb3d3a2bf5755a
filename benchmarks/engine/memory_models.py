"""Measured peak memory of the engine versus the byte models (DESIGN §3.8, §3.10; issue 11).

For every zoo model (committed profiles: mlp, mnistnet, convnet, and resnet18 / mobilenet at 32 and at
224), at four budgets from the minimum feasible to unconstrained, plan with the planner's virtual-clock
model (``engine``, items in flight from a replay of the schedule), execute the plan on the engine's
virtual clock at the paper's rate, and compare the engine's *measured* peak (distinct storages it holds +
autograd's saved tensors, sampled after every action; it never reads a cost model) with the bytes each
model predicts for the executed configuration: ``engine/schedule`` (the plan's own prediction),
``engine/cap`` (the bound that holds on any clock) and ``paper`` (eq. ferret-svre + extras).
Inputs are random tensors of the model's input shape (memory does not depend on pixel values).
Goal: measured ÷ predicted (engine/schedule) in [0.80, 1.00] for every row.

    .venv/bin/python -m benchmarks.engine.memory_models [--models mlp,mnistnet,...] [--out memory_models]

Items per run: max(30, 3·N·P) — the replay shows every zoo plan's per-worker peak within the first
3·P arrivals of each worker — rounded up so that the Iter-Fisher rings fill.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from benchmarks.support import stream
from ferret_core.engine import EngineSettings, FerretPolicy, simulate
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.staleness import staleness_bound
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parent / "profiles"
RESULTS = HERE / "results"
# name → (zoo model, input size)
MODELS = {
    "mlp": ("mlp", None),
    "mnistnet": ("mnistnet", None),
    "convnet": ("convnet", 32),
    "resnet18-32": ("resnet18", 32),
    "mobilenet-32": ("mobilenet", 32),
    "resnet18-224": ("resnet18", 224),
    "mobilenet-224": ("mobilenet", 224),
}
FRACTIONS = (0.0, 0.33, 0.66, 1.0)  # of the way from the minimum feasible to unconstrained bytes
COMPENSATOR = "iter-fisher"
MIN_ITEMS = 30


def items_for(plan_workers: int, stages: int, ring: int) -> int:
    return max(MIN_ITEMS, 3 * plan_workers * stages, plan_workers * (ring + 2))


def run_model(key: str) -> list[dict[str, object]]:
    name, size = MODELS[key]
    profile = ModelProfile.load(PROFILES / f"{key}.json")
    schedule = MemorySettings(in_flight="schedule", compensator=COMPENSATOR)
    planner = Planner(profile, PlannerSettings(memory=schedule))
    low, high = planner.min_feasible_bytes, planner.plan(None).planned_bytes
    rows = []
    for fraction in FRACTIONS:
        budget = int(low + fraction * (high - low))
        plan = planner.plan(budget)
        ring = max(staleness_bound(plan, j) for j in range(plan.num_stages))
        count = items_for(plan.num_workers, plan.num_stages, ring)
        model = build_model(name, input_size=size)
        started = time.perf_counter()
        result = simulate(
            model.units,
            FerretPolicy(plan),
            stream(model.input_shape, model.num_classes, count),
            model=name,
            profile=profile,
            arrival_interval=plan.arrival_interval,
            settings=EngineSettings(compensator=COMPENSATOR, keep_trace=False, validate=False),
        )
        seconds = time.perf_counter() - started
        cap = MemoryModel.for_plan(plan, profile, MemorySettings(compensator=COMPENSATOR))
        paper = MemoryModel.for_plan(plan, profile, MemorySettings(variant="paper", compensator=COMPENSATOR))
        measured = int(result.peak_bytes or 0)
        cap_bytes, paper_bytes = cap.total(plan.workers), paper.total(plan.workers)
        row = {
            "model": key,
            "budget_fraction": fraction,
            "budget_bytes": budget,
            "items": count,
            "stages": plan.num_stages,
            "live_workers": plan.live_workers,
            "slots": plan.num_workers,
            "recompute": any(w.recompute for w in plan.workers if w.live),
            "accumulation": any(a > 1 for w in plan.workers if w.live for a in w.accumulation),
            "omission": any(o > 0 for w in plan.workers if w.live for o in w.omission),
            "measured_peak_bytes": measured,
            "planned_bytes": plan.planned_bytes,
            "cap_bytes": cap_bytes,
            "paper_bytes": paper_bytes,
            "measured_over_predicted": measured / plan.planned_bytes,
            "measured_over_cap": measured / cap_bytes,
            "measured_over_paper": measured / paper_bytes,
            "measured_breakdown": dict(result.memory_breakdown),
            "predicted_breakdown": dict(plan.memory_breakdown),
            "trained": result.trained,
            "skipped": dict(result.skipped),
            "seconds": round(seconds, 1),
        }
        rows.append(row)
        print(
            f"{key} {fraction:.2f}: measured {measured / 2**20:.2f} MiB, predicted {plan.planned_bytes / 2**20:.2f} "
            f"(ratio {row['measured_over_predicted']:.3f}), cap {cap_bytes / 2**20:.2f}, paper "
            f"{paper_bytes / 2**20:.2f}; {count} items in {seconds:.0f} s",
            file=sys.stderr,
        )
    return rows


def technique_list(row: dict[str, object]) -> str:
    names = [t for t, on in (("T1", row["recompute"]), ("T2", row["accumulation"]), ("T3", row["omission"])) if on]
    if row["live_workers"] != row["slots"]:
        names.append("T4")
    return "+".join(names) or "–"


def table(rows: list[dict[str, object]]) -> str:
    lines = [
        "| model | budget (min→max) | plan: stages, live/slots, T1–T4 | items | measured MiB | predicted MiB "
        "| **measured ÷ predicted** | cap MiB (÷) | paper MiB (÷) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    mib = 2**20
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget_fraction']:.2f} | {r['stages']}, {r['live_workers']}/{r['slots']}, "
            f"{technique_list(r)} | {r['items']} | {r['measured_peak_bytes'] / mib:.2f} | "  # type: ignore[operator]
            f"{r['planned_bytes'] / mib:.2f} | **{r['measured_over_predicted']:.3f}** | "  # type: ignore[operator]
            f"{r['cap_bytes'] / mib:.2f} ({r['measured_over_cap']:.2f}) | "  # type: ignore[operator]
            f"{r['paper_bytes'] / mib:.2f} ({r['measured_over_paper']:.2f}) |"  # type: ignore[operator]
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated keys of MODELS")
    parser.add_argument("--out", default="memory_models", help="results/<out>.{md,json}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    rows = [row for key in args.models.split(",") for row in run_model(key)]
    text = table(rows)
    print(text)
    ratios = [float(r["measured_over_predicted"]) for r in rows]  # type: ignore[arg-type]
    command = f".venv/bin/python -m benchmarks.engine.memory_models --models {args.models} --out {args.out}"
    header = (
        f"Measured peak vs predicted bytes ({COMPENSATOR}, virtual clock at t^d = max t̂^f, random inputs; "
        f"load average {load_before:.2f} → {os.getloadavg()[0]:.2f}). Command: `{command}`.\n\n"
        f"measured ÷ predicted: min {min(ratios):.3f}, max {max(ratios):.3f} (goal [0.80, 1.00]).\n\n"
    )
    (RESULTS / f"{args.out}.md").write_text(header + text + "\n")
    (RESULTS / f"{args.out}.json").write_text(json.dumps({"command": command, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
