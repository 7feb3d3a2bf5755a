"""Oracle, 1-Skip and Ferret as policies over the one engine, and the result they report."""

from __future__ import annotations

import json

import pytest

from ferret_core.engine import FerretPolicy, OneSkip, Oracle, make_policy, simulate, validate_trace
from ferret_core.errors import ConfigError
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import LayerProfile, ModelProfile
from tests.unit.test_engine_support import Item, stream, tiny_units


def tiny_profile(t_f: float = 1.0, t_b: float = 2.0, units: int = 3) -> ModelProfile:
    layers = tuple(LayerProfile(f"u{i}", t_f, t_b, params=100, activations=8) for i in range(units))
    return ModelProfile("tiny", (6,), layers)


def test_one_skip_trains_only_when_the_trainer_is_free_at_arrival() -> None:
    # whole model: F = 3, B = 6 → the trainer is busy for 9 arrivals after each item it takes
    r = simulate(tiny_units(), OneSkip(), stream(27), model="tiny", profile=tiny_profile(), arrival_interval=1.0)
    assert (r.trained, r.skipped["busy"], r.items) == (3, 24, 27)
    assert r.num_stages == 1 and r.num_workers == 1 and r.max_staleness == (0,)
    assert r.trace is not None
    assert [e.item for e in r.trace if e.kind.value == "F"] == [0, 9, 18]
    assert r.planned_bytes is None


def test_oracle_trains_every_item_without_delay() -> None:
    r = simulate(tiny_units(), Oracle(), stream(27), model="tiny", profile=tiny_profile(), arrival_interval=1.0)
    assert (r.trained, sum(r.skipped.values()), r.updates_per_stage) == (27, 0, (27,))
    assert r.trace is not None and all(e.start == e.end for e in r.trace)
    assert all(e.start == e.item * 1.0 for e in r.trace)  # done at its own arrival


def test_unlabelled_items_are_predicted_but_not_trained() -> None:
    items = [Item(s.x, None if i % 3 == 0 else s.y) for i, s in enumerate(stream(12))]
    r = simulate(tiny_units(), Oracle(), items, model="tiny", profile=tiny_profile(), arrival_interval=1.0)
    assert r.items == 12 and r.skipped["no_label"] == 4 and r.trained == 8


def test_ferret_executes_a_planners_plan() -> None:
    profile = tiny_profile()
    plan = Planner(profile, PlannerSettings(arrival_interval=1.0)).plan(None)
    assert plan.num_workers > 1
    r = simulate(tiny_units(), FerretPolicy(plan), stream(40), model="tiny", profile=profile, arrival_interval=1.0)
    assert r.trace is not None
    validate_trace(r.trace, plan)
    assert r.planned_bytes == plan.planned_bytes
    assert r.skipped["busy"] == 0 and r.trained == 40


def test_ferret_with_removed_workers_skips_their_items() -> None:
    profile = tiny_profile()
    planner = Planner(profile, PlannerSettings(arrival_interval=1.0))
    plan = planner.plan(planner.min_feasible_bytes)
    removed = sum(not w.live for w in plan.workers)
    r = simulate(tiny_units(), FerretPolicy(plan), stream(40), model="tiny", profile=profile, arrival_interval=1.0)
    assert r.skipped["worker_removed"] == sum(
        1 for i in range(40) if not plan.workers[i % plan.num_workers].live
    )
    assert removed == 0 or r.skipped["worker_removed"] > 0


def test_result_is_json_ready() -> None:
    r = simulate(tiny_units(), Oracle(), stream(5), model="tiny", profile=tiny_profile(), arrival_interval=1.0)
    data = json.loads(json.dumps(r.to_dict()))
    assert {"oacc", "tacc", "items", "trained", "trained_any_stage", "skipped", "updates_per_stage", "peak_bytes",
            "planned_bytes", "mean_staleness", "lambda", "relative_correction", "wall_seconds"} <= set(data)
    assert data["lambda"] == [None]


def test_make_policy_by_name() -> None:
    assert make_policy("oracle").name == "oracle" and make_policy("1-skip").name == "1-skip"
    with pytest.raises(ConfigError, match="plan"):
        make_policy("ferret")
    with pytest.raises(ConfigError, match="plan"):
        make_policy("dapple")
    with pytest.raises(ConfigError, match="unknown method"):
        make_policy("gpipe")
