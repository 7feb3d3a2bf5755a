"""Planner benchmark: planning time per zoo model over a budget sweep, R_F versus budget, and how the
plan changes with the decay constant c. Profiles are loaded from benchmarks/profiles/ (profiling is not
timed). Writes results/planning_time.{md,json}, results/rate_vs_budget.png and results/decay.md.

    .venv/bin/python -m benchmarks.planner.bench_planner
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile

HERE = Path(__file__).resolve().parent
PROFILES = HERE.parent / "profiles"
RESULTS = HERE / "results"
MODELS = ("mlp", "mnistnet", "convnet", "resnet18-32", "resnet18-224", "mobilenet-32", "mobilenet-224")
SWEEP_POINTS = 12
GOAL_SECONDS = 1.0


def budget_sweep(planner: Planner) -> list[int]:
    low = planner.min_feasible_bytes
    high = planner.plan(None).planned_bytes
    if high <= low:
        return [low]
    return sorted({round(low * (high / low) ** (k / (SWEEP_POINTS - 1))) for k in range(SWEEP_POINTS)})


def time_model(name: str) -> dict[str, object]:
    profile = ModelProfile.load(PROFILES / f"{name}.json")
    reference = Planner(profile)
    budgets = budget_sweep(reference)
    cold, warm, rows = [], [], []
    for budget in budgets:
        start = time.perf_counter()
        Planner(profile).plan(budget)  # a fresh planner: every path, and the minimum, from scratch
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        plan = reference.plan(budget)  # re-planning with the paths cached (the control plane's case)
        warm.append(time.perf_counter() - start)
        rows.append(
            {
                "budget_bytes": budget,
                "adaptation_rate": plan.adaptation_rate,
                "planned_bytes": plan.planned_bytes,
                "stages": plan.num_stages,
                "workers": plan.num_workers,
                "live_workers": plan.live_workers,
                "recompute": any(w.recompute for w in plan.workers if w.live),
            }
        )
    return {
        "model": name,
        "units": profile.num_units,
        "partitions": len(reference.partitions),
        "min_feasible_bytes": reference.min_feasible_bytes,
        "unconstrained_bytes": reference.plan(None).planned_bytes,
        "cold_seconds_median": statistics.median(cold),
        "cold_seconds_max": max(cold),
        "warm_seconds_median": statistics.median(warm),
        "sweep": rows,
    }


def decay_study(name: str) -> list[dict[str, object]]:
    profile = ModelProfile.load(PROFILES / f"{name}.json")
    period = profile.sequential_time  # T: one sequential forward + backward of the whole model
    out = []
    for label, decay in (("0", 0.0), ("ln2/T", math.log(2) / period), ("10·ln2/T", 10 * math.log(2) / period)):
        # compensator pinned to what the committed results counted (the planner default before issue 13)
        planner = Planner(profile, PlannerSettings(decay=decay, memory=MemorySettings(compensator="iter-fisher")))
        low, high = planner.min_feasible_bytes, planner.plan(None).planned_bytes
        for budget_label, budget in (("unconstrained", None), ("mid", int(math.sqrt(low * high)))):
            plan = planner.plan(budget)
            kinds = [s.kind for s in plan.steps]
            out.append(
                {
                    "model": name,
                    "c": label,
                    "budget": budget_label,
                    "stages": [len(s) for s in plan.stages],
                    "workers": plan.num_workers,
                    "live": plan.live_workers,
                    "recompute": any(w.recompute for w in plan.workers if w.live),
                    "S2": kinds.count("S2"),
                    "S3": kinds.count("S3"),
                    "S4": kinds.count("S4"),
                    "adaptation_rate": plan.adaptation_rate,
                }
            )
    return out


def main() -> int:
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = [time_model(name) for name in MODELS]
    lines = [
        "| model | units | partitions | min feasible MiB | unconstrained MiB | cold plan s (median / max) |"
        " warm re-plan ms | max/goal |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['model']} | {r['units']} | {r['partitions']} | {r['min_feasible_bytes'] / 2**20:.1f} | "
            f"{r['unconstrained_bytes'] / 2**20:.1f} | {r['cold_seconds_median']:.3f} / {r['cold_seconds_max']:.3f} | "
            f"{r['warm_seconds_median'] * 1e3:.2f} | {r['cold_seconds_max'] / GOAL_SECONDS:.2f} |"
        )
    table = "\n".join(lines)
    print(table)
    (RESULTS / "planning_time.md").write_text(
        "Planning time per plan over a 12-point budget sweep (minimum feasible → unconstrained), "
        f"goal < {GOAL_SECONDS:g} s (ratio column: worst cold plan / goal).\n"
        "cold = a fresh Planner (all greedy paths and the minimum feasible bytes computed); "
        "warm = re-planning with cached paths (what SetMemoryBudget does).\n\n" + table + "\n"
    )
    (RESULTS / "planning_time.json").write_text(json.dumps(results, indent=2) + "\n")

    fig, ax = plt.subplots(figsize=(8, 5))
    for r in results:
        sweep = r["sweep"]
        assert isinstance(sweep, list)
        top = max(row["adaptation_rate"] for row in sweep)
        ax.plot(
            [row["budget_bytes"] / 2**20 for row in sweep],
            [row["adaptation_rate"] / top for row in sweep],
            marker="o",
            label=str(r["model"]),
        )
    ax.set_xscale("log")
    ax.set_xlabel("memory budget (MiB, log scale)")
    ax.set_ylabel("R_F / R_F(unconstrained)")
    ax.set_title("Planner: R_F versus budget (paper memory model + extras, fp32)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "rate_vs_budget.png", dpi=120)

    decay_rows = [row for name in MODELS for row in decay_study(name)]
    dl = [
        "| model | c | budget | stage sizes | N | live | T1 | S2 | S3 | S4 | R_F |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in decay_rows:
        dl.append(
            f"| {d['model']} | {d['c']} | {d['budget']} | {d['stages']} | {d['workers']} | {d['live']} | "
            f"{'on' if d['recompute'] else 'off'} | {d['S2']} | {d['S3']} | {d['S4']} | {d['adaptation_rate']:.4g} |"
        )
    decay_table = "\n".join(dl)
    print()
    print(decay_table)
    (RESULTS / "decay.md").write_text(
        "How the plan changes with the decay constant c (T = one sequential forward+backward of the whole "
        "model); 'mid' = the geometric mean of the minimum feasible and unconstrained bytes.\n\n" + decay_table + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
