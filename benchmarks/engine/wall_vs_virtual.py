"""(b) Wall-clock executors versus the virtual clock's compute, on the same MNIST items and plans.

For each plan (Ferret on MNISTNet from the committed profile: unconstrained, and at a budget that gives
two stages) the same items run

* on the virtual clock: ``compute s`` is the real time the simulation spent executing every action one
  after another (plus predictions); ``virtual s`` is the stream's duration in profile time;
* on the wall clock, flooded (every item submitted at once) and paced (one item every ``compute s /
  items``, the rate a sequential executor of this CPU sustains): real threads per (worker, stage) and a
  prediction thread, driven by the same scheduler.

Reported: trained items per second of elapsed time, items trained and skipped. On this machine (2 shared
cores, Python's GIL, batch-1 kernels of ~0.1–1 ms) threads cannot add compute, so the wall clock shows
the scheduler's and the threads' cost; on a GPU per stage they would overlap.

    .venv/bin/python -m benchmarks.engine.wall_vs_virtual --items 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from ferret_core.data import iter_stream, load_dataset
from ferret_core.engine import EngineSettings, FerretPolicy, StageTimes, StreamEngine
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.zoo import build_model

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = ROOT / "benchmarks" / "profiles" / "mnistnet.json"


def engine(plan: Plan) -> StreamEngine:
    model = build_model("mnistnet", seed=0)
    setup = FerretPolicy(plan).setup(model.name, model.num_units, plan.arrival_interval)
    return StreamEngine(model.units, setup, EngineSettings(compensator="iter-fisher"))


def measure(label: str, plan: Plan, profile: ModelProfile, items: list[Any]) -> dict[str, Any]:
    virtual = engine(plan).run_virtual(items, StageTimes.from_profile(profile, plan.partition), plan.arrival_interval)
    compute = virtual.wall_seconds
    row: dict[str, Any] = {
        "plan": label,
        "stages": plan.num_stages,
        "workers": f"{plan.live_workers}/{plan.num_workers}",
        "virtual": {"trained": virtual.trained, "skipped": virtual.skipped, "compute_s": compute,
                    "virtual_s": len(items) * plan.arrival_interval,
                    "trained_per_s": virtual.trained / compute},
    }
    for mode, interval in (("wall_flood", 0.0), ("wall_paced", compute / len(items))):
        result = engine(plan).run_wall(items, interval)
        row[mode] = {"arrival_interval_s": interval, "trained": result.trained, "skipped": result.skipped,
                     "elapsed_s": result.wall_seconds, "trained_per_s": result.trained / result.wall_seconds,
                     "mean_staleness": list(result.mean_staleness), "max_staleness": list(result.max_staleness)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=1000)
    parser.add_argument("--data-root", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    items = list(iter_stream(load_dataset("mnist", args.data_root), limit=args.items))
    profile = ModelProfile.load(PROFILE)
    planner = Planner(profile, PlannerSettings(memory=MemorySettings(compensator="iter-fisher")))  # as committed
    unconstrained = planner.plan(None)
    low, high = planner.min_feasible_bytes, unconstrained.planned_bytes
    two_stage = planner.plan(low + 2 * (high - low) // 3)
    engine(unconstrained).run_wall(items[:20], 0.0)  # warm-up (lazy autograd initialisation per thread)
    rows = [measure("ferret M+", unconstrained, profile, items), measure("ferret 2/3", two_stage, profile, items)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "wall_vs_virtual.json").write_text(json.dumps({"items": args.items, "rows": rows}, indent=2) + "\n")
    lines = [
        f"MNISTNet, {args.items} MNIST items, iter-fisher, 1 torch thread, 2 shared CPU cores.",
        "",
        "| plan | stages | live/slots | clock | arrival interval | trained | busy | elapsed s | trained / s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        v = row["virtual"]
        lines.append(f"| {row['plan']} | {row['stages']} | {row['workers']} | virtual (compute) | "
                     f"{unconstrained.arrival_interval * 1e3:.3g} ms (profile time) | {v['trained']} | "
                     f"{v['skipped']['busy']} | {v['compute_s']:.2f} | {v['trained_per_s']:.0f} |")
        for mode in ("wall_flood", "wall_paced"):
            w = row[mode]
            lines.append(f"| {row['plan']} | {row['stages']} | {row['workers']} | {mode.replace('_', ' ')} | "
                         f"{w['arrival_interval_s'] * 1e3:.3g} ms | {w['trained']} | {w['skipped']['busy']} | "
                         f"{w['elapsed_s']:.2f} | {w['trained_per_s']:.0f} |")
    (RESULTS / "wall_vs_virtual.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
