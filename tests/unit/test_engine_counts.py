"""Exact counts implied by the plan (eq. ferret-svre's factors), per worker n and stage i:
backward passes = items_n / LCM({c^o_{n,k}+1 : k ≥ i}) (±1); updates = backward passes / c^a_{n,i} (±1);
recompute forwards = backward passes when c^r_n = 1; nothing at all for a removed worker."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.plan import Plan
from tests.unit.test_engine_support import make_plan, run_plan, stream, uniform_times


def check_counts(plan: Plan, result_items: int, admitted: tuple[int, ...], backwards, updates, recomputes,
                 forwards) -> None:
    n_slots = plan.num_workers
    for w in plan.workers:
        n = w.index
        dispatched = len(range(n, result_items, n_slots))
        if not w.live:
            assert admitted[n] == 0
            assert all(c == 0 for grid in (backwards, updates, recomputes, forwards) for c in grid[n])
            continue
        assert admitted[n] == dispatched  # the arrival interval leaves every worker time (no busy skip)
        for i in range(plan.num_stages):
            period = math.lcm(*(o + 1 for o in w.omission[i:]))
            assert abs(backwards[n][i] - admitted[n] / period) <= 1, (n, i, backwards[n][i], admitted[n], period)
            assert backwards[n][i] == math.ceil(admitted[n] / period)
            assert abs(updates[n][i] - backwards[n][i] / w.accumulation[i]) <= 1
            assert updates[n][i] == backwards[n][i] // w.accumulation[i]
            assert recomputes[n][i] == (backwards[n][i] if w.recompute else 0)
            # every item that is back-propagated somewhere runs F at every stage
            assert forwards[n][i] == math.ceil(admitted[n] / math.lcm(*(o + 1 for o in w.omission[-1:])))


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"recompute": [True, False]},
        {"accumulation": [[2, 3, 1], [1, 2, 4]]},
        {"omission": [[1, 2, 0], [2, 0, 0]]},
        {"live": [False, True]},
        {"recompute": [False, True], "accumulation": [[2, 1, 3], [3, 2, 1]], "omission": [[2, 1, 0], [0, 1, 0]]},
    ],
    ids=["plain", "T1", "T2", "T3", "T4", "T1-T3"],
)
def test_counts_follow_the_plan(kwargs: dict) -> None:
    plan = make_plan(3, 2, **kwargs)
    _, r = run_plan(plan, stream(61), arrival=3.0, measure_memory=False)
    assert r.skipped["busy"] == 0
    check_counts(plan, r.items, r.admitted, r.backwards, r.updates, r.recomputes, r.forwards)
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items


def test_omission_at_the_last_stage_skips_items_as_omitted() -> None:
    plan = make_plan(2, 1, omission=[[0, 1]])
    _, r = run_plan(plan, stream(20), arrival=4.0, measure_memory=False)
    assert r.skipped["omitted"] == 10 and r.trained == 10
    assert r.admitted == (20,)


@given(
    stages=st.integers(1, 3),
    workers=st.integers(1, 3),
    data=st.data(),
)
def test_counts_hold_for_random_plans(stages: int, workers: int, data: st.DataObject) -> None:
    acc = [[data.draw(st.integers(1, 3)) for _ in range(stages)] for _ in range(workers)]
    om = [[data.draw(st.integers(0, 2)) for _ in range(stages - 1)] + [0] for _ in range(workers)]
    rec = [data.draw(st.booleans()) for _ in range(workers)]
    live = [data.draw(st.booleans()) for _ in range(workers)]
    live[data.draw(st.integers(0, workers - 1))] = True
    plan = make_plan(stages, workers, recompute=rec, accumulation=acc, omission=om, live=live)
    # slow arrivals: each worker finishes an item before its next one, so no item is busy-skipped
    arrival = 4.0 * stages
    _, r = run_plan(plan, stream(25), arrival=arrival, times=uniform_times(stages), measure_memory=False)
    check_counts(plan, r.items, r.admitted, r.backwards, r.updates, r.recomputes, r.forwards)
    assert r.updates_per_stage == tuple(sum(row[i] for row in r.updates) for i in range(stages))
