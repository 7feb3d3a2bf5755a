"""The staleness cost calibrated on the live stream's head (``services/trainer/staleness_live.py``): the
trainer collects its first labelled items, calibrates d(τ) on them and re-plans by the accuracy objective
through the control plane's re-planner; a failed calibration leaves it on R_F."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from ferret_core.data import load_dataset
from ferret_core.engine.staleness_calibration import CalibrationSettings
from ferret_core.errors import ConfigError
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import ModelProfile
from services.trainer.arrivals import SwitchablePlanner
from services.trainer.staleness_live import (
    CalibrationState,
    LiveCalibration,
    ModelSpec,
    calibrate_in_child,
)

REPO = Path(__file__).resolve().parents[2]
STEEP = StalenessCost((0.0, 1.0, 4.0), (1.0, 0.5, 0.1), source="steep")
SPEC = ModelSpec("mlp", (1, 8, 8), 10)
FEW = CalibrationSettings(staleness=(1, 2), every=(2, 3), seeds=(1000,), lr=0.05)


def _planners() -> SwitchablePlanner:
    """MNISTNet's committed profile at a stream R_F trains with 6 workers over 2 stages (each gradient ~5
    updates late): the plan a steep cost of staleness changes."""
    profile = ModelProfile.from_dict(json.loads((REPO / "benchmarks/profiles/mnistnet-batches.json").read_text()))
    settings = PlannerSettings(arrival_interval=1 / 3000, max_workers=8, max_stages=4)
    planner = Planner(profile, settings)
    planner.warm()
    return SwitchablePlanner(planner)


def _digits(count: int) -> list[tuple[torch.Tensor, int]]:
    ds = load_dataset("digits", None)
    return [(torch.from_numpy(ds.x_train[i]), int(ds.y_train[i])) for i in range(count)]


def _fixed(cost: StalenessCost | Exception, seen: list[int]):  # type: ignore[no-untyped-def]
    def calibrate(
        spec: ModelSpec, items: Sequence[tuple[torch.Tensor, int]], settings: CalibrationSettings, source: str
    ) -> StalenessCost:
        seen.append(len(items))
        if isinstance(cost, Exception):
            raise cost
        return cost

    return calibrate


def test_the_heads_labelled_items_are_calibrated_on_and_the_trainer_replans_by_accuracy() -> None:
    planners = _planners()
    before = planners.plan(None)
    assert (before.num_stages, before.live_workers) == (2, 6)
    requests: list[int | None] = []
    seen: list[int] = []
    live = LiveCalibration(planners, lambda: None, SPEC, items=20, settings=FEW, source="test",
                           calibrate=_fixed(STEEP, seen)).start(requests.append)  # fmt: skip
    for x, y in _digits(30):
        live.observe(x, None)  # unlabelled: predicted, never calibrated on
        live.observe(x, y)
    assert live.done.wait(30)
    assert seen == [20]  # the first 20 labelled items, no more
    assert live.state is CalibrationState.CALIBRATED and live.cost is STEEP
    assert live.counters() == {"staleness_calibration_state": 2, "staleness_calibration_items": 20}
    assert planners.current.settings.objective == "accuracy" and planners.current.settings.staleness_cost is STEEP
    assert planners.current.settings.arrival_interval == 1 / 3000  # the rest of the settings kept
    assert requests == [None]  # one re-plan, unconstrained stays unconstrained
    after = planners.plan(None)
    assert after.objectives is not None and after.objectives.cost_source == "steep"
    assert after.live_workers < before.live_workers  # stale gradients this dear: fewer workers


def test_a_failed_calibration_leaves_the_trainer_planning_by_rate() -> None:
    planners = _planners()
    rate = planners.current
    requests: list[int | None] = []
    live = LiveCalibration(planners, lambda: 123, SPEC, items=20, settings=FEW, source="test",
                           calibrate=_fixed(RuntimeError("the child died"), [])).start(requests.append)  # fmt: skip
    for x, y in _digits(20):
        live.observe(x, y)
    assert live.done.wait(30)
    assert live.state is CalibrationState.FAILED and live.error == "RuntimeError: the child died"
    assert planners.current is rate and requests == []
    assert live.counters()["staleness_calibration_state"] == 3


def test_too_few_items_for_the_staleness_points_are_refused_with_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"at least 6 items for staleness up to 2, got 5; raise trainer\."):
        LiveCalibration(_planners(), lambda: None, SPEC, items=5, settings=FEW, source="test")


def test_the_child_process_calibrates_the_trainers_model_on_the_head() -> None:
    """The default runner: a spawned child at a lower priority builds the model per seed and measures d."""
    cost = calibrate_in_child(SPEC, _digits(24), FEW, "digits head")
    assert cost.staleness == (0.0, 1.0, 2.0) and cost.worth[0] == 1.0
    assert all(0.0 <= w <= 1.0 for w in cost.worth) and cost.source == "digits head"
    assert set(cost.measurements["fresh_oacc"]) == {"1.0", "0.5", str(1 / 3)}
