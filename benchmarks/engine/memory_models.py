"""Measured peak memory of the engine versus the two cost models (DESIGN §3.8, §3.10).

For mlp, mnistnet and convnet (committed profiles), at four budgets from the minimum feasible to
unconstrained, plan with the default planner (paper memory model + extras, Iter-Fisher), execute the
plan on the engine's virtual clock at the paper's rate, and compare the engine's *measured* peak
(distinct storages it holds + autograd's saved tensors, sampled after every action; independent of any
cost model) with the bytes both models predict for the executed configuration:
``paper`` (eq. ferret-svre + extras) and ``engine`` (what §3.13's engine holds + extras).
Inputs are random tensors of the model's input shape (memory does not depend on pixel values).

    .venv/bin/python benchmarks/engine/memory_models.py
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from ferret_core.cost_model import StageGeometry
from ferret_core.engine import EngineSettings, FerretPolicy, simulate
from ferret_core.memory_model import MemoryModel, MemorySettings
from ferret_core.planner import Planner
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parent / "profiles"
RESULTS = HERE / "results"
MODELS = {"mlp": {}, "mnistnet": {}, "convnet": {"input_size": 32}}
ITEMS = 300
FRACTIONS = (0.0, 0.33, 0.66, 1.0)  # of the way from the minimum feasible to unconstrained bytes


@dataclass(frozen=True)
class Item:
    x: torch.Tensor
    y: int | None


def stream(shape: tuple[int, ...], classes: int, count: int) -> list[Item]:
    g = torch.Generator().manual_seed(0)
    return [Item(torch.rand(shape, generator=g), int(torch.randint(classes, (1,), generator=g))) for _ in range(count)]


def main() -> int:
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    rows = []
    for name, kwargs in MODELS.items():
        profile = ModelProfile.load(PROFILES / f"{name}.json")
        planner = Planner(profile)
        low, high = planner.min_feasible_bytes, planner.plan(None).predicted_bytes
        for fraction in FRACTIONS:
            budget = int(low + fraction * (high - low))
            plan = planner.plan(budget)
            model = build_model(name, **kwargs)  # type: ignore[arg-type]
            items = stream(model.input_shape, model.num_classes, ITEMS)
            result = simulate(
                model.units,
                FerretPolicy(plan),
                items,
                model=name,
                profile=profile,
                arrival_interval=plan.arrival_interval,
                settings=EngineSettings(compensator="iter-fisher", keep_trace=False, validate=False),
            )
            geometry = StageGeometry.from_profile(profile, plan.partition)
            engine_model = MemoryModel(geometry, profile, MemorySettings(variant="engine"))
            engine_bytes = engine_model.total(plan.workers)
            measured = int(result.peak_bytes or 0)
            rows.append(
                {
                    "model": name,
                    "budget_fraction": fraction,
                    "budget_bytes": budget,
                    "stages": plan.num_stages,
                    "live_workers": plan.live_workers,
                    "slots": plan.num_workers,
                    "measured_peak_bytes": measured,
                    "paper_bytes": plan.predicted_bytes,
                    "engine_bytes": engine_bytes,
                    "measured_over_paper": measured / plan.predicted_bytes,
                    "measured_over_engine": measured / engine_bytes,
                    "measured_breakdown": dict(result.memory_breakdown),
                    "engine_breakdown": engine_model.breakdown(plan.workers),
                    "paper_breakdown": dict(plan.memory_breakdown),
                    "trained": result.trained,
                }
            )
            print(
                f"{name} {fraction:.2f}: measured {measured / 2**20:.2f} MiB, "
                f"paper {plan.predicted_bytes / 2**20:.2f}, engine {engine_bytes / 2**20:.2f}",
                file=sys.stderr,
            )
    lines = [
        "| model | budget (of min→max) | plan (stages, live/slots) | measured MiB | paper MiB | engine MiB "
        "| measured ÷ paper | measured ÷ engine |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['budget_fraction']:.2f} | {r['stages']}, {r['live_workers']}/{r['slots']} | "
            f"{r['measured_peak_bytes'] / 2**20:.2f} | {r['paper_bytes'] / 2**20:.2f} | "
            f"{r['engine_bytes'] / 2**20:.2f} | "
            f"{r['measured_over_paper']:.2f} | {r['measured_over_engine']:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    load = os.getloadavg()[0]
    (RESULTS / "memory_models.md").write_text(
        f"Measured peak vs predicted bytes ({ITEMS} items per run, Iter-Fisher, virtual clock at t^d = max t̂^f; "
        f"load average {load:.2f}). Command: `.venv/bin/python benchmarks/engine/memory_models.py`.\n\n" + table + "\n"
    )
    (RESULTS / "memory_models.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
