"""The executed trace: invariants, staleness against the schedule's bound, the failure table, CSV, and
determinism."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.engine import Kind, TraceError, TraceEvent, validate_trace
from ferret_core.engine.trace import check_trace, format_table, from_csv, mean_staleness, plan_bounds, to_csv
from ferret_core.plan import Plan
from tests.unit.test_engine_support import make_plan, run_plan, stream, uniform_times


def executed(plan: Plan, n: int = 40, arrival: float = 1.0, **kw: object) -> list[TraceEvent]:
    _, r = run_plan(plan, stream(n), arrival=arrival, measure_memory=False, **kw)
    assert r.trace is not None
    return list(r.trace)


def test_trace_of_a_multi_worker_pipeline_is_valid() -> None:
    plan = make_plan(3, 2)
    trace = executed(plan)
    validate_trace(trace, plan)
    assert {e.kind for e in trace} == {Kind.F, Kind.B, Kind.U}


def test_forward_precedes_backward_and_executors_never_overlap() -> None:
    plan = make_plan(3, 3, recompute=True)
    trace = executed(plan, arrival=4 / 3)
    seen_f = set()
    for e in trace:
        if e.kind is Kind.F:
            seen_f.add((e.item, e.stage))
        elif e.kind in (Kind.R, Kind.B):
            assert (e.item, e.stage) in seen_f
    by_executor: dict[tuple[int, int], list[TraceEvent]] = {}
    for e in trace:
        if e.kind is not Kind.U:
            by_executor.setdefault(e.executor, []).append(e)
    for events in by_executor.values():
        events.sort(key=lambda e: e.start)
        assert all(b.start >= a.end for a, b in itertools.pairwise(events))


def test_mean_staleness_is_positive_with_several_workers_and_stages() -> None:
    plan = make_plan(3, 2)
    _, r = run_plan(plan, stream(40), measure_memory=False)
    assert r.trace is not None
    assert all(s > 0 for s in r.mean_staleness[:-1])
    assert r.mean_staleness == pytest.approx(mean_staleness(r.trace, 3))
    assert r.max_staleness <= r.staleness_bound


def test_one_worker_staleness_is_pipedreams_p_minus_1_minus_i() -> None:
    plan = make_plan(4, 1)
    _, r = run_plan(plan, stream(40), arrival=3.0, measure_memory=False)
    assert r.max_staleness == (3, 2, 1, 0)
    assert r.staleness_bound == (3, 2, 1, 0)


@given(stages=st.integers(1, 4), tf=st.sampled_from([1.0, 2.0]), tb=st.sampled_from([1.0, 2.0, 3.0]),
       recompute=st.booleans(), arrival=st.sampled_from([0.75, 1.0, 1.5, 2.0]), data=st.data())
def test_staleness_stays_within_the_bound_for_planned_worker_counts(
    stages: int, tf: float, tb: float, recompute: bool, arrival: float, data: st.DataObject
) -> None:
    """N = ⌈(t^f + t^b + c^r t^f)/t^d⌉ (Alg. 2), some workers removed (T4), c^a = 1, no omission."""
    workers = math.ceil((tf + tb + recompute * tf) / arrival - 1e-9)
    live = [data.draw(st.booleans()) for _ in range(workers)]
    live[0] = True
    plan = make_plan(stages, workers, num_units=4, recompute=recompute, live=live)
    trace = executed(plan, n=60, arrival=arrival, times=uniform_times(stages, tf, tb))
    validate_trace(trace, plan)


@pytest.mark.parametrize(
    ("kwargs", "arrival", "tf", "tb"),
    [
        ({"stages": 2, "workers": 2, "recompute": True, "accumulation": [[3, 3], [3, 1]]}, 2.0, 1.0, 1.0),
        ({"stages": 3, "workers": 3, "omission": [[2, 1, 0], [0, 2, 0], [1, 1, 0]]}, 0.75, 1.0, 1.0),
    ],
    ids=["T2", "T3"],
)
def test_staleness_bound_with_accumulation_or_omission(kwargs: dict, arrival: float, tf: float, tb: float) -> None:
    """N from Alg. 2's formula, so workers keep up; benchmarks/engine/staleness_bound.py has more cases."""
    stages = kwargs.pop("stages")
    plan = make_plan(stages, kwargs.pop("workers"), num_units=4, **kwargs)
    trace = executed(plan, n=150, arrival=arrival, times=uniform_times(stages, tf, tb))
    validate_trace(trace, plan)


def _break(trace: list[TraceEvent], index: int, **changes: object) -> list[TraceEvent]:
    broken = list(trace)
    broken[index] = dataclasses.replace(trace[index], **changes)  # type: ignore[arg-type]
    return broken


def test_a_backward_before_its_forward_fails_with_the_marked_table() -> None:
    plan = make_plan(3, 2)
    trace = executed(plan)
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.B and e.stage == 1)
    f = next(e for e in trace if e.kind is Kind.F and (e.item, e.stage) == (trace[i].item, 1))
    broken = _break(trace, i, start=f.start - 0.5, end=f.start)
    with pytest.raises(TraceError) as err:
        validate_trace(broken, plan)
    text = str(err.value)
    print(text)
    assert f"B{trace[i].item} at stage 1 before its F" in text
    assert ">>" in text and f"*B{trace[i].item}" in text and "w0s0" in text and "w1s2" in text


def test_overlapping_actions_on_one_executor_fail() -> None:
    plan = make_plan(3, 2)
    trace = executed(plan)
    first = next(e for e in trace if e.executor == (0, 0))
    i = next(i for i, e in enumerate(trace) if e.executor == (0, 0) and e.kind is Kind.F and e.start > first.end)
    broken = _break(trace, i, start=first.start + 0.25, end=first.start + 0.75)
    violations = check_trace(broken, 3)
    assert any("runs" in v.message and "while" in v.message for v in violations)


def test_a_gradient_staler_than_the_bound_fails() -> None:
    plan = make_plan(3, 1)
    trace = executed(plan, arrival=3.0)
    bounds = plan_bounds(plan)
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.B and e.stage == 0 and e.version_read >= 3)
    f = next(k for k, e in enumerate(trace) if e.kind is Kind.F and (e.item, e.stage) == (trace[i].item, 0))
    broken = _break(_break(trace, i, version_read=0), f, version_read=0)
    violations = check_trace(broken, 3, bounds)
    assert any("exceeds the bound" in v.message for v in violations)


def test_a_forward_reading_a_version_its_worker_does_not_hold_fails() -> None:
    plan = make_plan(2, 2)
    trace = executed(plan)
    i = next(i for i, e in enumerate(trace) if e.kind is Kind.F and e.version_read > 0)
    violations = check_trace(_break(trace, i, version_read=trace[i].version_read + 7), 2)
    assert any("replica is at version" in v.message for v in violations)


def test_table_shows_updates_beside_their_backward() -> None:
    plan = make_plan(2, 1)
    table = format_table(executed(plan, n=6, arrival=3.0))
    assert "B0+U" in table and "w0s1" in table


def test_csv_round_trip() -> None:
    trace = executed(make_plan(3, 2, recompute=True), n=12)
    assert from_csv(to_csv(trace)) == trace


def test_same_seed_gives_the_same_result_and_trace() -> None:
    plan = make_plan(3, 2, recompute=[True, False], accumulation=[[2, 1, 1], [1, 1, 2]])
    runs = [run_plan(plan, stream(30, seed=4), compensator="iter-fisher")[1] for _ in range(2)]
    a, b = (dataclasses.replace(r, wall_seconds=0.0) for r in runs)
    assert a == b
    assert a.to_dict() == b.to_dict()
