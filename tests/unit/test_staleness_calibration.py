"""The cost of staleness: the exchange rate d(τ) (``StalenessCost``), its calibration on the engine
(``calibrate_staleness``) and the CLI's cached calibration (``services.cli.calibration``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ferret_core.data import StreamItem
from ferret_core.engine.staleness_calibration import CalibrationSettings, calibrate_staleness, run_point
from ferret_core.errors import ConfigError
from ferret_core.planning.staleness_cost import StalenessCost
from services.cli.calibration import calibrated_cost, load_cost

from .test_engine_support import stream, tiny_units


def test_worth_is_the_fresh_fraction_with_the_same_accuracy() -> None:
    cost = StalenessCost.from_accuracies({1.0: 30.0, 0.5: 20.0, 0.25: 10.0}, {2: 25.0, 4: 20.0, 8: 5.0})
    assert cost.staleness == (0.0, 2.0, 4.0, 8.0)
    assert cost.worth == (1.0, 0.75, 0.5, 0.25)  # 25 lies halfway between f = 0.5 and 1; 5 below f = 0.25


def test_measurements_are_made_monotone() -> None:
    # the fresh curve is pooled where noise makes it fall (0.5: 10 < 0.25: 14 → both 12)
    cost = StalenessCost.from_accuracies({1.0: 32.0, 0.5: 10.0, 0.25: 14.0}, {1: 22.0, 2: 32.0, 3: 12.0})
    assert cost.worth[1] == pytest.approx(0.5 + 0.5 * 10 / 20)
    assert cost.worth[2] == cost.worth[1]  # better than τ = 1 measured, held at τ = 1's worth (a running min)
    assert cost.worth[3] == pytest.approx(0.25)  # 12 is first reached at f = 0.25 on the pooled curve
    assert cost.measurements["stale_oacc"] == {"1": 22.0, "2": 32.0, "3": 12.0}


def test_discount_interpolates_and_extrapolates_down_to_zero() -> None:
    cost = StalenessCost((0.0, 2.0, 4.0), (1.0, 0.5, 0.4))
    assert cost.discount(0.0) == 1.0
    assert cost.discount(1.0) == pytest.approx(0.75)
    assert cost.discount(3.0) == pytest.approx(0.45)
    assert cost.discount(6.0) == pytest.approx(0.3)  # the last segment's slope
    assert cost.discount(100.0) == 0.0
    assert StalenessCost.zero().discount(50.0) == 1.0 and StalenessCost.zero().is_zero


@pytest.mark.parametrize(
    ("staleness", "worth", "message"),
    [
        ((0.0, 1.0), (1.0,), "one worth per staleness point"),
        ((1.0, 2.0), (1.0, 0.5), "start at 0"),
        ((0.0, 1.0), (0.9, 0.5), "worth 1 item"),
        ((0.0, 1.0), (1.0, 1.5), r"\[0, 1\]"),
        ((0.0, 1.0, 2.0), (1.0, 0.5, 0.6), "must not grow"),
    ],
)
def test_invalid_costs_are_refused(staleness: tuple[float, ...], worth: tuple[float, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        StalenessCost(staleness, worth)


def test_from_accuracies_needs_every_item_fresh() -> None:
    with pytest.raises(ConfigError, match=r"fraction 1\.0"):
        StalenessCost.from_accuracies({0.5: 10.0}, {1: 5.0})
    with pytest.raises(ConfigError, match=r"\(0, 1\]"):
        StalenessCost.from_accuracies({1.0: 10.0, 2.0: 12.0}, {1: 5.0})


def test_a_cost_round_trips_through_json(tmp_path: Path) -> None:
    cost = StalenessCost.from_accuracies({1.0: 30.0, 0.5: 20.0}, {1: 25.0}, source="test")
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(cost.to_dict()))
    assert load_cost(path) == cost
    path.write_text("{}")
    with pytest.raises(ConfigError, match="not a staleness cost"):
        load_cost(path)


def _items(count: int) -> list[StreamItem]:
    return [StreamItem(i, item.x, int(item.y or 0), 0) for i, item in enumerate(stream(count))]


@pytest.mark.parametrize("tau", [1, 3])
def test_a_stale_calibration_run_applies_every_gradient_exactly_tau_late(tau: int) -> None:
    settings = CalibrationSettings(lr=0.05)
    result = run_point("tiny", (tiny_units(num_units=2), _items(40)), workers=tau + 1, intervals=tau + 1,
                       settings=settings)
    assert result.max_staleness == (tau,) and result.trained == 40
    assert 0.0 <= result.oacc <= 100.0


def test_a_fresh_calibration_run_trains_one_item_in_k_at_staleness_0() -> None:
    result = run_point("tiny", (tiny_units(num_units=1), _items(40)), workers=1, intervals=4,
                       settings=CalibrationSettings())
    assert result.max_staleness == (0,)
    assert result.trained == 10 and result.skipped["busy"] == 30  # items 0, 4, 8, …


def test_calibrate_gives_a_valid_cost_and_reports_progress() -> None:
    settings = CalibrationSettings(staleness=(1, 2), every=(2,), seeds=(0, 1), lr=0.1)
    told: list[str] = []
    cost = calibrate_staleness(
        "tiny", lambda seed: (tiny_units(seed, num_units=1), _items(30)), settings, source="tiny", on_run=told.append
    )
    assert cost.staleness == (0.0, 1.0, 2.0) and cost.worth[0] == 1.0
    assert len(told) == (1 + 1 + 2) * 2
    assert set(cost.measurements["fresh_oacc"]) == {"0.5", "1.0"}
    assert cost.measurements["settings"]["seeds"] == [0, 1]


def test_the_cli_caches_a_calibration_by_the_streams_head(tmp_path: Path) -> None:
    settings = CalibrationSettings(staleness=(1,), every=(2,), seeds=(0,), lr=0.1)
    built: list[int] = []

    def build(seed: int) -> list[torch.nn.Module]:
        built.append(seed)
        return tiny_units(seed, num_units=1)

    head = _items(20)
    cost, path = calibrated_cost(model="tiny", build_units=build, head=head, settings=settings, source="t",
                                 cache_dir=tmp_path)
    assert path is not None and path.exists() and load_cost(path) == cost
    runs = len(built)
    again, same = calibrated_cost(model="tiny", build_units=build, head=head, settings=settings, source="t",
                                  cache_dir=tmp_path)
    assert (again, same) == (cost, path) and len(built) == runs  # read back, nothing re-run
    _, other = calibrated_cost(model="tiny", build_units=build, head=_items(21)[1:], settings=settings, source="t",
                               cache_dir=tmp_path)
    assert other != path  # another head, another key
    with pytest.raises(ConfigError, match="at least 4 items"):
        calibrated_cost(model="tiny", build_units=build, head=head[:3], settings=settings, source="t", cache_dir=None)
