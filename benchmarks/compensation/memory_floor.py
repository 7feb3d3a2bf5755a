"""The planner's memory floor per compensator, as a byte breakdown: what M− can go down to, and why.

For each profile and compensator it runs ``ferret plan --json`` (unconstrained, for ``min_feasible_bytes``)
and then ``ferret plan --budget <that minimum> --json``, and prints the plan at the floor (stages ×
workers, staleness bound per stage) with its predicted bytes by component, and the floor ÷ 1-Skip's
measured peak bytes (from the committed standard ``overall`` runs). Compensator state is counted only at
stages the plan can make stale, so a 1 × 1 plan at the floor holds none, whatever the compensator.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.compensation.memory_floor
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path
from typing import Any

from ferret_core.plan import Plan
from ferret_core.staleness import staleness_bound
from services.cli.main import main as cli_main

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
# profile, 1-Skip's measured peak bytes (benchmarks/paper/results/standard/overall/runs.csv, every seed alike)
PROFILES = (
    ("benchmarks/profiles/mnistnet-batches.json", "MNISTNet", 9_599_064),
    ("benchmarks/profiles/convnet-batches.json", "ConvNet", 4_962_904),
    ("benchmarks/profiles/mlp-digits-batches.json", "digits MLP", 406_616),
)
COMPENSATORS = ("none", "fisher", "iter-fisher", "iter-fisher-lean", "dc-asgd-a")
IN_FLIGHT = "schedule"  # as the bench plans (services/bench/budgets.py): the virtual clock's items in flight


def plan_json(profile: str, compensator: str, budget: int | None) -> dict[str, Any]:
    argv = ["plan", "--profile", str(REPO / profile), "--compensator", compensator, "--in-flight", IN_FLIGHT, "--json"]
    if budget is not None:
        argv += ["--budget", str(budget)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(argv)
    if code != 0:
        raise SystemExit(f"ferret plan {' '.join(argv)} exited {code}")
    result: dict[str, Any] = json.loads(out.getvalue())
    return result


def main() -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    lines = [
        "# The planner's memory floor (M−'s lower end) per compensator, engine memory model",
        "",
        f"Command: `python -m benchmarks.compensation.memory_floor` (commit {commit}). Bytes are the planner's "
        f"predicted bytes (`ferret plan --in-flight {IN_FLIGHT} --budget <min> --json`, as the bench plans); "
        "÷ 1-Skip is against 1-Skip's measured peak.",
    ]
    for profile, label, one_skip in PROFILES:
        lines += [
            "",
            f"### {label} (1-Skip measured {one_skip:,} B)",
            "",
            "| compensator | floor B | ÷ 1-Skip | plan | bound per stage | breakdown (B) |",
            "|---|---:|---:|---|---|---|",
        ]
        for compensator in COMPENSATORS:
            floor = int(plan_json(profile, compensator, None)["min_feasible_bytes"])
            at = plan_json(profile, compensator, floor)
            plan = Plan.from_dict(at)
            bounds = [staleness_bound(plan, j) for j in range(plan.num_stages)]
            parts = ", ".join(f"{k} {v:,}" for k, v in sorted(at["memory_breakdown"].items()) if v)
            lines.append(
                f"| {compensator} | {floor:,} | {floor / one_skip:.2f} | {plan.num_stages} × {plan.live_workers} | "
                f"{bounds} | {parts} |"
            )
    print("\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "memory_floor.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
