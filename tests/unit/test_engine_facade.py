"""The engine facade as adapters use it: the wall clock's :class:`Arrival` names the worker, ``stats()``
reports typed counters, ``score_online`` off leaves scoring to the caller."""

from __future__ import annotations

import pytest

from ferret_core.compensation import CompensatorSettings
from ferret_core.engine import EngineSettings, EngineStats, FerretPolicy, StreamEngine
from tests.unit.test_engine_support import make_plan, run_plan, stream, tiny_units

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
