"""The staleness bound of one worker (ferret_core/staleness.py, DESIGN §3.13) holds on the virtual clock's
executed schedule for any T1/T2/T3 configuration, stage times and arrival interval.

The case that once broke it: under T3 an item not back-propagated at stage i leaves i's in-flight set at its
last backward higher up, possibly before an older back-propagated item's backward at i; so the older items
in flight at i need not be consecutive, and T3's period does not thin the back-propagated ones among them
(the bound had ⌊(P−1−i)/period⌋ and read 0 where the schedule reached 1: a Iter-Fisher ring the byte model
did not count, found by ``test_memory_bound.py``'s hypothesis test).
"""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferret_core.engine import EngineSettings, FerretPolicy, StageTimes, StreamEngine
from ferret_core.plan import WorkerConfig
from ferret_core.staleness import staleness_bound
from tests.unit.test_memory_bound import make_items, plan_of, sized_profile, wide_units


def _max_staleness(bounds: tuple[int, ...], worker: WorkerConfig, times: list[tuple[float, float]], arrival: float,
                   items: int) -> tuple[list[int], list[int]]:
    """(executed max staleness, the plan's bound) per stage of a one-worker plan on the virtual clock."""
    units = wide_units([8] * (bounds[-1] - 1), 0)
    profile = sized_profile(units, times[: len(units)])
    plan = plan_of(bounds, [worker], arrival)
    engine = StreamEngine(
        units, FerretPolicy(plan).setup("tiny", len(units), arrival),
        EngineSettings(compensator="none", keep_trace=False, measure_memory=False),
    )
    result = engine.run_virtual(make_items(items, 0), StageTimes.from_profile(profile, plan.partition), arrival)
    return list(result.max_staleness), [staleness_bound(plan, j) for j in range(plan.num_stages)]


def test_the_t3_case_that_broke_the_bound() -> None:
    """1 worker, 3 stages, stage 1 back-propagated one item in 3: stage 0 reached staleness 1 (the old
    bound said 0)."""
    worker = WorkerConfig(0, True, False, (1, 1, 1), (0, 2, 0))
    reached, bound = _max_staleness((0, 1, 2, 3), worker, [(1.0, 1.0), (1.0, 3.0), (1.0, 1.0)], 1.0, 10)
    assert reached[0] == 1 and bound[0] >= 1
    assert all(r <= b for r, b in zip(reached, bound, strict=True))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(1, 4),
    st.booleans(),
    st.lists(st.integers(1, 3), min_size=4, max_size=4),
    st.lists(st.integers(0, 2), min_size=3, max_size=3),
    st.lists(st.tuples(st.floats(0.2, 3.0), st.floats(0.2, 5.0)), min_size=4, max_size=4),
    st.floats(0.3, 4.0),
)
def test_one_workers_executed_staleness_never_exceeds_the_bound(
    stages: int,
    recompute: bool,
    accumulation: list[int],
    omission: list[int],
    times: list[tuple[float, float]],
    arrival: float,
) -> None:
    torch.manual_seed(0)
    worker = WorkerConfig(0, True, recompute, tuple(accumulation[:stages]), (*omission[: stages - 1], 0))
    reached, bound = _max_staleness(tuple(range(stages + 1)), worker, times, arrival, 60)
    assert all(r <= b for r, b in zip(reached, bound, strict=True)), (reached, bound)
