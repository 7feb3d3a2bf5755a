"""M- is bisected per compensator: the bench keys budgets by the compensator an arm plans with."""

from __future__ import annotations

from services.bench.driver import _arm_compensator, _budget_key
from services.bench.experiments import MNIST, experiment, preset
from services.bench.specs import Arm


def test_pipelines_arms_plan_with_none_and_overall_arms_with_iter_fisher() -> None:
    pipelines = experiment("pipelines", preset("quick"))
    assert pipelines.budgeted_compensators("vanilla", None, "iter-fisher") == ("none",)
    overall = experiment("overall", preset("quick"))
    assert overall.budgeted_compensators("vanilla", None, "iter-fisher") == ("iter-fisher",)


def test_budget_keys_differ_per_compensator_and_keep_the_old_key_for_iter_fisher() -> None:
    assert _budget_key(MNIST, 250) == f"{MNIST.id}|{MNIST.profile}|250"
    assert _budget_key(MNIST, 250, compensator="none") == f"{MNIST.id}|{MNIST.profile}|250|c=none"
    assert _budget_key(MNIST, 250, "er", "dc-asgd-a") == f"{MNIST.id}|{MNIST.profile}|250|er|c=dc-asgd-a"
    assert _arm_compensator(Arm("ferret-M", "ferret", "M")) == "iter-fisher"
    assert _arm_compensator(Arm("ferret-M", "ferret", "M", compensator="none")) == "none"


def test_the_compensation_report_shows_per_stage_correction_and_the_histogram() -> None:
    from services.bench.reports import compensation

    rows = [
        {
            "setting": "mnist/mnistnet", "column": "ferret-M+", "algorithm": "vanilla", "budget": "M+",
            "compensator": c, "seed": seed, "oacc": 50.0 + seed + (c == "dc-asgd-a"), "tacc": 60.0,
            "relative_correction": "" if c == "none" else f"{0.01 * (c == 'dc-asgd-a') + 0.0005};0",
            "staleness_histogram": "0:1 4:9;0:10",
        }
        for c in ("none", "fisher", "dc-asgd-a")
        for seed in range(3)
    ]  # fmt: skip
    text = compensation(rows)
    assert "| mnist/mnistnet | M+ |" in text
    assert "[0.011, 0]" in text and "[0.0005, 0]" in text  # 2 significant digits
    assert "0:1 4:9 / 0:10" in text
