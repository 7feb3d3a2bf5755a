"""Every pipeline schedule the paper compares (its Table "pipeline-ablation") on MNIST / MNISTNet through
``ferret simulate``: DAPPLE, ZB, Hanayo 1/2/3 waves, PipeDream, PipeDream-2BW and Ferret, all on Ferret's
partition L* and worker slots planned at the budget halfway between the minimum feasible and the
unconstrained plan (the paper's "M"), at the paper's rate (t^d = max_i t̂_i^f), without compensation
(as the paper's table), plus 1-Skip and Oracle for scale.

Each run is the CLI itself (``python -m services.cli.main simulate ... --json``); the script collects the
JSON reports into ``results/methods.json`` and the table ``results/methods.md`` (agm against DAPPLE, the
table's baseline, beside the paper's MNIST/MnNet row).

    .venv/bin/python -m benchmarks.schedules.compare_schedules --items 5000
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.support import simulate_json
from ferret_core.metrics import agm
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile

ROOT = Path(__file__).resolve().parents[2]

RESULTS = Path(__file__).resolve().parent / "results"
PROFILE = ROOT / "benchmarks" / "profiles" / "mnistnet.json"
METHODS = ("oracle", "1-skip", "dapple", "zb", "hanayo-1w", "hanayo-2w", "hanayo-3w", "pipedream", "pipedream-2bw",
           "ferret")
# the paper's Table "pipeline-ablation", MNIST/MnNet row: agm against DAPPLE
PAPER_AGM = {"dapple": 0.0, "zb": 6.79, "hanayo-1w": 2.44, "hanayo-2w": 5.0, "hanayo-3w": 7.12, "pipedream": 8.16,
             "pipedream-2bw": 8.23, "ferret": 8.35}


def run_simulate(method: str, items: int, budget: int) -> dict[str, Any]:
    return simulate_json(["--dataset", "mnist", "--model", "mnistnet", "--method", method, "--items", str(items),
                          "--profile", str(PROFILE.relative_to(ROOT)), "--budget", str(budget),
                          "--compensator", "none"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=5000)
    parser.add_argument("--table-only", action="store_true", help="re-render results/methods.md from the JSON")
    args = parser.parse_args()
    if args.table_only:
        summary = json.loads((RESULTS / "methods.json").read_text())
        (RESULTS / "methods.md").write_text(table(summary) + "\n")
        print(table(summary))
        return
    profile = ModelProfile.load(PROFILE)
    planner = Planner(profile, PlannerSettings(memory=MemorySettings(compensator="none")))  # as the CLI plans here
    low, high = planner.min_feasible_bytes, planner.plan(None).planned_bytes
    budget = low + (high - low) // 2
    load_before = os.getloadavg()[0]
    reports: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        r = reports[method] = run_simulate(method, args.items, budget)
        print(f"{method:<14} oacc {r['oacc']:6.2f}  tacc {r['tacc']:6.2f}  trained {r['trained']:5d}  "
              f"peak {r['peak_bytes'] / 2**20:7.2f} MiB  planned {r['planned_bytes'] / 2**20:7.2f} MiB  "
              f"{r['wall_seconds']:6.1f} s", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    summary = {"items": args.items, "profile": str(PROFILE.relative_to(ROOT)), "min_feasible_bytes": low,
               "unconstrained_bytes": high, "budget": budget, "load_average": [load_before, os.getloadavg()[0]],
               "reports": reports}
    (RESULTS / "methods.json").write_text(json.dumps(summary, indent=2) + "\n")
    (RESULTS / "methods.md").write_text(table(summary) + "\n")
    print(table(summary))


def table(summary: dict[str, Any]) -> str:
    reports = summary["reports"]
    base = reports["dapple"]
    plan = base["plan"]
    lines = [
        f"MNIST / MNISTNet, {summary['items']} items, t^d = max_i t̂_i^f = {base['arrival_interval'] * 1e3:.4g} ms "
        f"({summary['profile']}), SGD lr 1e-3, seed 0, no compensation. Ferret's plan at the budget "
        f"{summary['budget'] / 2**20:.2f} MiB (halfway between the minimum feasible "
        f"{summary['min_feasible_bytes'] / 2**20:.2f} and the unconstrained "
        f"{summary['unconstrained_bytes'] / 2**20:.2f} MiB): L* = {plan['num_stages']} stages {plan['stages']}, "
        f"{plan['num_workers']} worker slots "
        f"({plan['live_workers']} live for Ferret); every schedule runs on L* and all slots. Flush group m = P. "
        f"Command per row: `{base['command'].replace('--method dapple', '--method <method>')}`.",
        "",
        "| method | rows | oacc % | tacc % | trained | busy | updates / stage | max staleness | measured peak MiB "
        "| planned MiB | measured ÷ planned | agm vs DAPPLE | paper agm (MNIST/MnNet) | compute s |",
        "|" + "---|" * 14,
    ]
    for method, r in reports.items():
        gain = agm(r["oacc"], base["oacc"], r["peak_bytes"], base["peak_bytes"])
        paper = PAPER_AGM.get(method)
        lines.append(
            f"| {method} | {r['num_workers']} | {r['oacc']:.2f} | {r['tacc']:.2f} | {r['trained']} "
            f"| {r['skipped']['busy']} | {r['updates_per_stage']} | {r['max_staleness']} "
            f"| {r['peak_bytes'] / 2**20:.2f} | {r['planned_bytes'] / 2**20:.2f} "
            f"| {r['peak_bytes'] / r['planned_bytes']:.2f} | {gain:.2f} | {'–' if paper is None else paper} "
            f"| {r['wall_seconds']:.1f} |"
        )
    load = summary.get("load_average", [None, None])
    lines += ["", f"Load average before / after: {load[0]:.2f} / {load[1]:.2f} (compute seconds are not the "
              "result: the virtual clock's outcome does not depend on them)."]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
