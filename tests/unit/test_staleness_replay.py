"""The tensor-free replay of the virtual clock's staleness equals what the engine executes."""

from __future__ import annotations

import math
import random

import pytest

from ferret_core.schedule.staleness_replay import replay_staleness
from ferret_core.staleness import staleness_bound
from tests.unit.test_engine_support import make_plan, run_plan, stream, uniform_times

ITEMS = stream(90)


def _case(seed: int):  # type: ignore[no-untyped-def]
    """A random plan as benchmarks/engine/staleness_bound.py draws them (T2, T3, T4 mixed)."""
    rng = random.Random(seed)
    stages = rng.randint(1, 3)
    tf, tb = rng.choice([(1.0, 1.0), (1.0, 2.0), (2.0, 3.0)])
    recompute = rng.random() < 0.3
    td = rng.choice([0.75, 1.0, 1.5, 2.0])
    workers = math.ceil((tf + tb + recompute * tf) / td - 1e-9)
    acc = [[rng.choice([1, 1, 2]) for _ in range(stages)] for _ in range(workers)]
    om = [[rng.choice([0, 0, 1]) for _ in range(stages - 1)] + [0] for _ in range(workers)]
    live = [True] + [rng.random() > 0.3 for _ in range(workers - 1)]
    plan = make_plan(stages, workers, recompute=recompute, accumulation=acc, omission=om, live=live)
    return plan, uniform_times(stages, tf, tb), td


@pytest.mark.parametrize("seed", range(12))
def test_replay_matches_the_executed_staleness(seed: int) -> None:
    plan, times, td = _case(seed)
    _, result = run_plan(plan, ITEMS, arrival=td, times=times, measure_memory=False, keep_trace=False)
    reached = replay_staleness(plan, times, td, len(ITEMS))
    assert reached.applied_max == result.max_staleness
    assert [dict(h) for h in reached.applied_histogram] == [dict(h) for h in result.staleness_histogram]
    bounds = [staleness_bound(plan, j) for j in range(plan.num_stages)]
    assert all(c <= a <= b for c, a, b in zip(reached.compensated_max, reached.applied_max, bounds, strict=True))


def test_one_stage_five_workers_reaches_four_where_the_bound_says_eight() -> None:
    plan = make_plan(1, 5)
    reached = replay_staleness(plan, uniform_times(1, 1.0, 4.0), 1.0, 200)
    assert staleness_bound(plan, 0) == 8
    assert reached.applied_max == (4,) and reached.compensated_max == (4,)


def test_one_worker_one_stage_is_never_stale() -> None:
    reached = replay_staleness(make_plan(1, 1), uniform_times(1), 3.0, 50)
    assert reached.compensated_max == (0,) and reached.applied_histogram == ({0: reached.applied_histogram[0][0]},)


@pytest.mark.parametrize("seed", range(6))
def test_the_engine_sizes_each_ring_to_the_staleness_reached(seed: int) -> None:
    plan, times, td = _case(seed)
    engine, result = run_plan(
        plan, ITEMS, arrival=td, times=times, measure_memory=False, keep_trace=False, compensator="iter-fisher"
    )
    reached = replay_staleness(plan, times, td, len(ITEMS))
    for j, comp in enumerate(engine.pipeline.compensators):
        assert comp.ring.capacity == reached.compensated_max[j]  # type: ignore[attr-defined]
        assert len(comp.ring) == min(reached.compensated_max[j], result.updates_per_stage[j])  # type: ignore[attr-defined]
        assert comp.truncated == 0


def test_one_stage_five_workers_keeps_four_deltas() -> None:
    engine, result = run_plan(
        make_plan(1, 5), stream(60), arrival=1.0, times=uniform_times(1, 1.0, 4.0), compensator="iter-fisher"
    )
    ring = engine.pipeline.compensators[0].ring  # type: ignore[attr-defined]
    assert result.max_staleness == (4,) and len(ring) == ring.capacity == 4
    assert result.staleness_bound == (8,)
