"""End to end (STYLE 13): ``ferret demo`` at a slow stream rate (50 items/s, the demo's default before it
streamed at 1.5x the plain loop's rate), where one unsplit worker keeps up and its plan is already the
smallest feasible one: the budget step shows the control plane's refusal of an
infeasible budget (FAILED_PRECONDITION with the minimum), says so in its log and report, and the plan in
force stays. (The cut that changes the plan, at the paper's rate, is ``test_demo_e2e.py``'s.)"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from services.demo.options import REPO_ROOT, ferret_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_demo_at_a_slow_rate_shows_the_refusal_and_keeps_its_plan(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    argv = [*ferret_command(), "demo", "--items", "300", "--rate", "50", "--dataset", "digits", "--model", "mlp"]
    argv += ["--no-live", "--no-plain-consumer"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRET_")}
    done = subprocess.run(
        [*argv, "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["complete"] and summary["predictions_counted_from_topic"] == 300
    assert summary["planned_bytes_before"] == summary["min_feasible_bytes"]  # the smallest plan already
    assert summary["budget_changes"] == [] and summary["budget_step"].startswith("refusal")
    refusal = summary["budget_refusal"]
    assert refusal["code"] == "FAILED_PRECONDITION" and refusal["min_feasible_bytes"] == summary["min_feasible_bytes"]
    assert refusal["to"] < refusal["min_feasible_bytes"] and not refusal["plan_changed"]
    assert summary["plans"]["after"] == summary["plans"]["before"] and summary["budget_bytes"] is None
    assert "no budget changes the plan" in done.stderr  # the log says why, as the report does
    assert "budget step (no smaller plan exists)" in (out / "report.md").read_text()
    assert summary["plain_consumer"] is None  # --no-plain-consumer
    # measured bytes are never 0 once the trainer serves (a re-plan on the measured rate included), and
    # stay within the plan in force
    timeline = json.loads((out / "timeline.json").read_text())
    assert timeline and all(p["measured_bytes"] > 0 for p in timeline)
    assert all(p["measured_bytes"] <= p["planned_bytes"] for p in timeline)
