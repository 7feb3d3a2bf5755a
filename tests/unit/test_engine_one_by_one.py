"""The 1 × 1 plan's per-item cost cuts keep the engine's results. SGD into given storage is one
``torch._foreach_add_`` (bit-identical to ``torch.sub``); an in-place update's memory sample that the B
sample before it provably dominates is not taken (the peak and its breakdown are unchanged, and at every
skipped point what the engine holds is at most that B sample); the executor takes its next action in the
same hold of the lock (the trace stays valid, the weights equal plain SGD)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from ferret_core.engine import EngineSettings, FerretPolicy, Kind, StreamEngine, validate_trace
from ferret_core.engine.optim import SGD
from ferret_core.engine.pipeline import Pipeline
from ferret_core.errors import ScheduleError
from tests.unit.test_engine_support import make_plan, stream, tiny_units, uniform_times
from tests.unit.test_engine_wall import _plain_sgd_on


def _engine(plan, units=None, **kw: object) -> StreamEngine:  # type: ignore[no-untyped-def]
    units = units if units is not None else tiny_units(num_units=plan.partition.num_units)
    return StreamEngine(units, FerretPolicy(plan).setup("tiny", len(units), 0.0), EngineSettings(**kw))  # type: ignore[arg-type]


@settings(max_examples=25, deadline=None)
@given(lr=st.floats(1e-4, 1.0), seed=st.integers(0, 2**16), steps=st.integers(1, 5), in_place=st.booleans())
def test_sgd_into_given_storage_is_bit_identical_to_torch_sub(lr: float, seed: int, steps: int, in_place: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 7), (3,)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    reference = [p.clone() for p in params]
    sgd = SGD(lr)
    for _ in range(steps):
        grads = [torch.randn(s, generator=gen) * 10 for s in shapes]
        out = params if in_place else [torch.empty(s) for s in shapes]
        new = sgd.step(0, params, grads, out=out)
        assert all(n is o for n, o in zip(new, out, strict=True))
        reference = [torch.sub(r, g, alpha=lr) for r, g in zip(reference, grads, strict=True)]
        params = new
    for p, r in zip(params, reference, strict=True):
        assert torch.equal(p, r)


def test_sgd_rejects_mismatched_tensor_lists() -> None:
    with pytest.raises(ScheduleError, match="must match one to one"):
        SGD(0.1).step(0, [torch.zeros(2)], [torch.zeros(2), torch.zeros(2)], out=[torch.zeros(2)])


def _watch_skips(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Record, at every update sample the pipeline skips, (what the engine holds then, the B sample)."""
    seen: list[tuple[int, int]] = []
    original = Pipeline._update_sample_dominated

    def watched(self: Pipeline, same_storages: bool) -> bool:
        skip = original(self, same_storages)
        if skip and self.meter is not None:
            seen.append((self.meter.walk(), self.meter.last_bytes))
        return skip

    monkeypatch.setattr(Pipeline, "_update_sample_dominated", watched)
    return seen


@pytest.mark.parametrize("interval", [0.0, 0.002])
def test_a_skipped_update_sample_is_dominated_on_the_wall_clock(
    monkeypatch: pytest.MonkeyPatch, interval: float
) -> None:
    seen = _watch_skips(monkeypatch)
    units, items = tiny_units(), stream(40)
    engine = _engine(make_plan(1, 1, num_units=3), units, lr=0.05)
    r = engine.run_wall(items, arrival_interval=interval)
    assert seen, "no update sample was skipped on a 1 x 1 plain plan"
    assert all(held <= b_sample for held, b_sample in seen)
    assert r.trace is not None
    validate_trace(r.trace, engine.pipeline.plan, check_staleness=False)
    trained = [e.item for e in r.trace if e.kind is Kind.B]
    assert [e.kind for e in r.trace if e.item == trained[0]] == [Kind.F, Kind.B, Kind.U]
    assert_close(engine.pipeline.master_state()[0], _plain_sgd_on(units, items, trained, 0.05), rtol=0.0, atol=0.0)


def test_the_peak_and_its_breakdown_equal_those_with_every_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """The virtual clock (deterministic): the same run with every update sampled gives the same peak and
    breakdown, with one sample more per skipped update."""
    plan = make_plan(1, 1, num_units=3)
    skipping = _engine(plan, lr=0.05)
    with_skips = skipping.run_virtual(stream(40), uniform_times(1), arrival_interval=3.0)
    monkeypatch.setattr(Pipeline, "_update_sample_dominated", lambda self, same_storages: False)
    every = _engine(plan, lr=0.05)
    with_all = every.run_virtual(stream(40), uniform_times(1), arrival_interval=3.0)
    assert with_skips.trained == with_all.trained > 0
    assert with_skips.peak_bytes == with_all.peak_bytes
    assert with_skips.memory_breakdown == with_all.memory_breakdown
    assert skipping.pipeline.meter is not None and every.pipeline.meter is not None
    assert every.pipeline.meter.samples - skipping.pipeline.meter.samples == with_all.trained


@pytest.mark.parametrize(
    ("plan_args", "kw"),
    [((2, 1), {}), ((1, 2), {}), ((1, 1), {"momentum": 0.9})],
    ids=["two-stages", "two-workers", "momentum"],
)
def test_no_update_sample_is_skipped_outside_the_plain_one_by_one_in_place_case(
    monkeypatch: pytest.MonkeyPatch, plan_args: tuple[int, int], kw: dict[str, object]
) -> None:
    seen = _watch_skips(monkeypatch)
    stages, workers = plan_args
    engine = _engine(make_plan(stages, workers, num_units=3), lr=0.05, **kw)
    r = engine.run_virtual(stream(20), uniform_times(stages), arrival_interval=1.0)
    assert r.trained > 0 and seen == []
