"""The engine facade as adapters use it: the wall clock's :class:`Arrival` names the worker, ``stats()``
reports typed counters, ``score_online`` off leaves scoring to the caller, and the compensators' state
round-trips exactly and carries across a re-plan (:mod:`ferret_core.engine.carry`)."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine import EngineSettings, EngineStats, FerretPolicy, StreamEngine
from ferret_core.engine.carry import carry_compensator_states
from ferret_core.errors import ConfigError
from tests.unit.test_engine_support import make_plan, run_plan, stream, tiny_units, uniform_times

# η_λ large enough that λ visibly moves in a few dozen items (the paper's 2e-6 leaves it at λ⁰).
TUNED = CompensatorSettings(eta_lambda=0.5)


def engine_for(plan, compensator: str = "iter-fisher", seed: int = 0, **settings: object) -> StreamEngine:  # type: ignore[no-untyped-def]
    units = tiny_units(seed=seed, num_units=plan.partition.num_units)
    engine_settings = EngineSettings(compensator=compensator, compensator_settings=TUNED, **settings)  # type: ignore[arg-type]
    return StreamEngine(units, FerretPolicy(plan).setup("tiny", len(units), 1.0), engine_settings)


def test_arrival_carries_the_worker_the_pipeline_dispatched_to() -> None:
    plan = make_plan(2, 3, live=[True, False, True])
    engine = engine_for(plan, compensator="none")
    items = stream(12)
    with engine.wall_clock() as clock:
        arrivals = []
        for i, item in enumerate(items):
            arrivals.append(clock.submit(item.x, item.y, index=i).result(10))
            clock.drain(10)  # one at a time: no worker is ever busy
        unlabelled = clock.submit(items[0].x, None, index=99).result(10)
    for a in arrivals:
        if a.index % 3 == 1:
            assert a.skipped is not None and a.skipped.value == "worker_removed" and a.worker is None
        else:
            assert a.skipped is None and a.worker == a.index % 3
    assert unlabelled.worker is None and unlabelled.skipped is not None


def test_stats_match_the_result_and_are_typed() -> None:
    plan = make_plan(3, 2, accumulation=[[1, 2, 1], [2, 1, 1]])
    engine, result = run_plan(plan, stream(30))
    stats = engine.stats()
    assert isinstance(stats, EngineStats)
    assert (stats.items, stats.trained) == (result.items, result.trained)
    assert stats.trained_any_stage == result.trained_any_stage
    assert stats.skipped == result.skipped and stats.updates_per_stage == result.updates_per_stage
    assert stats.updates == sum(result.updates_per_stage) and stats.in_flight == 0
    assert stats.peak_bytes == result.peak_bytes and stats.mean_staleness == result.mean_staleness
    assert stats.max_staleness == result.max_staleness
    with pytest.raises(AttributeError):
        stats.items = 0  # type: ignore[misc]


def test_score_online_off_leaves_scoring_to_the_caller() -> None:
    plan = make_plan(1, 1)
    _, scored = run_plan(plan, stream(20))
    _, unscored = run_plan(plan, stream(20), score_online=False)
    assert scored.oacc > 0 and unscored.oacc == 0.0
    assert unscored.items == scored.items == 20 and unscored.trained == scored.trained


def _tensors_equal(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert_close(a, b, rtol=0.0, atol=0.0)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            _tensors_equal(a[key], b[key])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _tensors_equal(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert a == b


@pytest.mark.parametrize("compensator", ["iter-fisher", "iter-fisher-cf", "gap-aware", "fisher"])
def test_compensator_state_round_trips_exactly(compensator: str) -> None:
    plan = make_plan(3, 2)
    engine = engine_for(plan, compensator)
    engine.run_virtual(stream(40), uniform_times(3), 1.0)
    saved = engine.compensator_state()
    if compensator.startswith("iter-fisher"):
        assert saved[0]["lambda"] != 0.2  # λ moved: the test would notice a reset
        assert len(saved[0]["ring"]["deltas"]) > 0 and saved[0]["v_r"] is not None
    other = engine_for(plan, compensator, seed=1)
    other.load_compensator_state(saved)
    restored = other.compensator_state()
    _tensors_equal(saved, restored)  # λ, v_r, v_a, the ring's deltas (oldest first), counters


def test_compensator_state_refuses_another_plans_rings() -> None:
    engine = engine_for(make_plan(3, 2))
    engine.run_virtual(stream(20), uniform_times(3), 1.0)
    other = engine_for(make_plan(3, 1))  # one worker: smaller staleness bounds, smaller rings
    with pytest.raises(ConfigError, match="capacity"):
        other.load_compensator_state(engine.compensator_state())


def test_a_replan_with_the_same_partition_carries_lambda_and_moments_and_empties_the_ring() -> None:
    old = engine_for(make_plan(3, 2))
    old.run_virtual(stream(40), uniform_times(3), 1.0)
    states = old.compensator_state()
    new = engine_for(make_plan(3, 1))  # the same stages, one worker fewer
    new.carry_compensator_state(states, same_partition=True)
    carried = new.compensator_state()
    for before, after in zip(states, carried, strict=True):
        assert after["lambda"] == before["lambda"]
        _tensors_equal(before["v_r"], after["v_r"])
        _tensors_equal(before["v_a"], after["v_a"])
        assert [after[k] for k in ("calls", "compensated", "truncated")] == [
            before[k] for k in ("calls", "compensated", "truncated")
        ]
        assert after["ring"]["deltas"] == [] and after["ring"]["pushed"] == 0


def test_a_replan_that_moves_the_stages_resplits_per_parameter_state_and_weights_lambda() -> None:
    old = engine_for(make_plan(2, 1, num_units=4))  # stages [0, 2), [2, 4)
    old.run_virtual(stream(40), uniform_times(2), 1.0)
    states = old.compensator_state()
    new = engine_for(make_plan(4, 1, num_units=4))  # one unit per stage
    new.carry_compensator_state(states, same_partition=False)
    carried = new.compensator_state()
    for key in ("v_r", "v_a"):
        flat_old = [t for s in states for t in s[key]]
        flat_new = [t for s in carried for t in s[key]]
        _tensors_equal(flat_old, flat_new)  # every parameter keeps its values
    # each new stage's parameters all come from one old stage: its λ exactly
    assert [s["lambda"] for s in carried] == [states[0]["lambda"]] * 2 + [states[1]["lambda"]] * 2
    assert all(s["calls"] == 0 and s["ring"]["deltas"] == [] for s in carried)


def test_lambda_of_a_merged_stage_is_the_element_weighted_mean() -> None:
    params = [[torch.zeros(3)], [torch.zeros(1)]]
    old = [make_compensator("iter-fisher", p, TUNED, 2).state_dict() for p in params]
    old[0]["lambda"], old[1]["lambda"] = 1.0, 5.0
    fresh = [make_compensator("iter-fisher", [torch.zeros(3), torch.zeros(1)], TUNED, 4).state_dict()]
    [merged] = carry_compensator_states(old, fresh, same_partition=False)
    assert merged["lambda"] == pytest.approx((3 * 1.0 + 1 * 5.0) / 4)


def test_gap_aware_keeps_its_step_average_and_the_smallest_update_count() -> None:
    params = [[torch.zeros(2)], [torch.zeros(2)]]
    old = [make_compensator("gap-aware", p, TUNED, 0) for p in params]
    for k, compensator in enumerate(old):
        for _ in range(k + 2):
            compensator.observe_update([torch.ones(2)])
    fresh = [make_compensator("gap-aware", [torch.zeros(2), torch.zeros(2)], TUNED, 0).state_dict()]
    [merged] = carry_compensator_states([c.state_dict() for c in old], fresh, same_partition=False)
    assert merged["updates"] == 2
    _tensors_equal(merged["avg_step"], [old[0].state_dict()["avg_step"][0], old[1].state_dict()["avg_step"][0]])


def test_carrying_between_different_compensators_is_refused() -> None:
    old = [make_compensator("gap-aware", [torch.zeros(2)], TUNED, 0).state_dict()]
    fresh = [make_compensator("iter-fisher", [torch.zeros(2)], TUNED, 1).state_dict()]
    with pytest.raises(ConfigError, match="different compensators"):
        carry_compensator_states(old, fresh, same_partition=True)
