"""``--objective`` on the CLI: ``ferret plan`` prints both objectives (and ``--json`` carries them as an
addition), ``--objective accuracy`` needs a measured cost, and ``ferret simulate --objective accuracy``
calibrates one on the stream's head and caches it; the trainer plans by it with ``trainer.staleness_cost``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import LayerProfile, ModelProfile
from services.cli.main import EXIT_FAILURE, main

from .planner_fixtures import GOLDEN_A_UNITS, profile_from

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def profile_file(tmp_path: Path) -> Path:
    profile = dataclasses.replace(profile_from(GOLDEN_A_UNITS, name="mnistnet"), input_shape=(1, 28, 28))
    path = tmp_path / "mnistnet.json"
    profile.save(path)
    return path


@pytest.fixture
def steep_cost(tmp_path: Path) -> Path:
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(StalenessCost((0.0, 1.0, 4.0), (1.0, 0.5, 0.1), source="steep").to_dict()))
    return path


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["plan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_plan_json_carries_both_objectives(
    profile_file: Path, steep_cost: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rate = plan_json(capsys, "--profile", str(profile_file), "--arrival-interval", "3")
    objectives = rate["objectives"]
    assert isinstance(objectives, dict)
    assert objectives["objective"] == "rate" and objectives["rate"] == rate["adaptation_rate"]
    assert objectives["accuracy"] is None and len(objectives["expected_staleness"]) == rate["num_stages"]
    with_cost = plan_json(capsys, "--profile", str(profile_file), "--arrival-interval", "3",
                          "--staleness-cost", str(steep_cost))
    assert with_cost["workers"] == rate["workers"]  # the cost alone changes no plan: the objective does
    assert with_cost["objectives"]["accuracy"] < with_cost["objectives"]["rate"]  # type: ignore[index]
    accuracy = plan_json(capsys, "--profile", str(profile_file), "--arrival-interval", "3",
                         "--objective", "accuracy", "--staleness-cost", str(steep_cost))
    chosen = accuracy["objectives"]
    assert isinstance(chosen, dict) and chosen["objective"] == "accuracy" and chosen["cost_source"] == "steep"
    assert chosen["accuracy"] >= with_cost["objectives"]["accuracy"]  # type: ignore[index]
    assert Plan.from_dict(accuracy).to_dict() == accuracy


def test_plan_table_prints_both_objectives(
    profile_file: Path, steep_cost: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", "--profile", str(profile_file), "--staleness-cost", str(steep_cost)]) == 0
    out = capsys.readouterr().out
    assert "rate objective R_F = " in out and "accuracy objective R_F × d(τ) = " in out
    assert "expected staleness per stage" in out
    assert main(["plan", "--profile", str(profile_file)]) == 0
    assert "not evaluated (needs a measured staleness cost" in capsys.readouterr().out


def test_accuracy_without_a_cost_fails_with_the_fix(profile_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--profile", str(profile_file), "--objective", "accuracy"]) == EXIT_FAILURE
    assert "--staleness-cost FILE" in capsys.readouterr().err


def test_simulate_calibrates_on_the_streams_head_and_caches_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = (
        LayerProfile("fc1", 2e-4, 4e-4, 64 * 256 + 256, 256),
        LayerProfile("fc2", 1e-4, 2e-4, 256 * 128 + 128, 128),
        LayerProfile("fc3", 5e-5, 1e-4, 128 * 10 + 10, 10),
    )
    profile = tmp_path / "mlp.json"
    ModelProfile("mlp", (1, 8, 8), layers).save(profile)
    argv = ["simulate", "--model", "mlp", "--dataset", "digits", "--method", "ferret", "--items", "40",
            "--profile", str(profile), "--lr", "0.05", "--objective", "accuracy", "--cache-dir", str(tmp_path),
            "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    cost_file = Path(report["staleness_cost_file"])
    assert cost_file.parent == tmp_path / "staleness" and cost_file.exists()
    assert report["staleness_cost"]["source"].startswith("digits head of 40 items")
    objectives = report["plan"]["objectives"]
    assert objectives["objective"] == "accuracy" and objectives["accuracy"] is not None
    assert main(argv) == 0  # the second run reads the cached cost: the same plan
    assert json.loads(capsys.readouterr().out)["plan"] == report["plan"]
    assert main(["plan", "--profile", str(profile), "--objective", "accuracy", "--staleness-cost", str(cost_file),
                 "--in-flight", "schedule", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workers"] == report["plan"]["workers"]


def test_simulate_calibrates_under_the_compensator_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = (
        LayerProfile("fc1", 2e-4, 4e-4, 64 * 256 + 256, 256),
        LayerProfile("fc2", 1e-4, 2e-4, 256 * 128 + 128, 128),
        LayerProfile("fc3", 5e-5, 1e-4, 128 * 10 + 10, 10),
    )
    profile = tmp_path / "mlp.json"
    ModelProfile("mlp", (1, 8, 8), layers).save(profile)
    argv = ["simulate", "--model", "mlp", "--dataset", "digits", "--method", "ferret", "--items", "40",
            "--profile", str(profile), "--lr", "0.05", "--objective", "accuracy", "--cache-dir", str(tmp_path),
            "--compensator", "dc-asgd-a", "--calibration-compensator", "dc-asgd-a", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    cost = report["staleness_cost"]
    assert cost["measurements"]["settings"]["compensator"] == "dc-asgd-a"
    assert cost["source"].endswith(", compensator dc-asgd-a")
    assert Path(report["staleness_cost_file"]).parent == tmp_path / "staleness"


def test_bench_plans_ferret_by_the_objective_it_is_given() -> None:
    from services.bench.experiments import experiment, preset
    from services.bench.runner import simulate_argv

    rate = experiment("overall", preset("quick"), seeds=1)
    accuracy = experiment("overall", preset("quick"), seeds=1, objective="accuracy")
    for before, after in zip(rate.expand(), accuracy.expand(), strict=True):
        argv = simulate_argv(after, None)
        if after.arm.method == "ferret":
            assert argv[-2:] == ["--objective", "accuracy"] and after.key != before.key
        else:
            assert "--objective" not in argv and after.key == before.key
        assert "--objective" not in simulate_argv(before, None)
    fixed = experiment("compensation", preset("quick"), seeds=1, objective="accuracy")
    assert all(a.objective == "rate" for a in fixed.arms)  # the ablation's plans are fixed files


def test_the_trainer_plans_by_the_accuracy_objective_with_a_calibrated_cost(steep_cost: Path) -> None:
    """`trainer.objective: accuracy` with `trainer.staleness_cost` (the JSON simulate caches): the start-up
    planner ranks by R_F × d(τ), and where stale gradients cost this much it plans fewer workers than R_F;
    without a cost it starts by R_F (the trainer calibrates a cost on the stream's head:
    ``services/trainer/staleness_live.py``)."""
    from services.config import load_settings
    from services.config.values import SettingsError
    from services.trainer.executors import ExecutorChoice
    from services.trainer.runner import make_planner

    profile = ModelProfile.from_dict(json.loads((REPO / "benchmarks/profiles/mnistnet-batches.json").read_text()))
    choice = ExecutorChoice("threads", "test", configured=True)
    env = {"FERRET_TRAINER_STREAM_RATE": "3000", "FERRET_TRAINER_MAX_WORKERS": "8", "FERRET_TRAINER_MAX_STAGES": "4"}
    rate = make_planner(load_settings(None, env=env), profile, choice).plan(None)
    env |= {"FERRET_TRAINER_OBJECTIVE": "accuracy", "FERRET_TRAINER_STALENESS_COST": str(steep_cost)}
    accuracy = make_planner(load_settings(None, env=env), profile, choice).plan(None)
    assert accuracy.objectives is not None and accuracy.objectives.objective == "accuracy"
    assert accuracy.objectives.cost_source == "steep"
    assert (rate.num_stages, rate.live_workers) == (2, 6)  # R_F: 6 workers, each gradient ~5 updates late
    assert accuracy.live_workers < rate.live_workers  # a steep cost: fewer workers sharing the master
    uncalibrated = load_settings(None, env={**env, "FERRET_TRAINER_STALENESS_COST": ""})
    assert uncalibrated.trainer.objective == "accuracy" and uncalibrated.trainer.staleness_cost is None
    before = make_planner(uncalibrated, profile, choice).plan(None)
    assert before.objectives is None  # R_F alone, no cost to weigh it with
    assert (before.num_stages, before.live_workers) == (rate.num_stages, rate.live_workers)
    with pytest.raises(SettingsError, match=r"trainer\.calibration_items"):
        load_settings(None, env={"FERRET_TRAINER_CALIBRATION_ITEMS": "10"})
    steep_cost.write_text("not a cost")
    with pytest.raises(ConfigError, match=r"trainer\.staleness_cost: staleness cost .* cannot read a JSON document"):
        make_planner(load_settings(None, env=env), profile, choice)
