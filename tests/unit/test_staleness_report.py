"""The staleness histogram and λ over the run, as ``ferret simulate --json`` reports them."""

from __future__ import annotations

from ferret_core.compensation import CompensatorSettings
from tests.unit.test_engine_support import make_plan, run_plan, stream, uniform_times


def test_the_histogram_counts_every_applied_gradient_by_its_staleness() -> None:
    _, result = run_plan(make_plan(2, 3), stream(40), arrival=1.0, times=uniform_times(2), compensator="dc-asgd-a")
    assert len(result.staleness_histogram) == 2
    for j, hist in enumerate(result.staleness_histogram):
        assert sum(hist.values()) == result.updates_per_stage[j]  # c^a = 1: one gradient per update
        assert max(hist) == result.max_staleness[j]
    as_json = result.to_dict()["staleness_histogram"]
    assert as_json == [{str(k): h[k] for k in sorted(h)} for h in result.staleness_histogram]


def test_lambda_trace_is_reported_with_none_where_a_stage_has_no_lambda() -> None:
    import dataclasses

    _, result = run_plan(
        make_plan(1, 2), stream(20), compensator="iter-fisher", compensator_settings=CompensatorSettings()
    )
    traced = dataclasses.replace(result, lambda_trace=((0, (0.2,)), (20, (float("nan"),))))
    assert traced.to_dict()["lambda_trace"] == [{"items": 0, "lambda": [0.2]}, {"items": 20, "lambda": [None]}]
