"""Non-finite losses and gradients never reach the weights: the item's gradient is
dropped, the item is counted once as skipped ``non_finite``, and the stream trains on."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.engine import (
    METHOD_NAMES,
    METHODS,
    EngineSettings,
    FerretPolicy,
    Kind,
    MethodOptions,
    SkipReason,
    StreamEngine,
    make_policy,
)
from ferret_core.engine.buffering import BufferingSettings
from ferret_core.engine.stage_update import _all_finite_exact, all_finite
from ferret_core.ocl import AlgorithmSettings, make_algorithm
from tests.unit.test_engine_support import Item, make_plan, stream, tiny_units, uniform_times

BUFFERING = ("random-n", "last-n", "camel")  # methods that train mini-batches drawn from a window
HUGE = 3e38  # a finite float32 input that overflows the first layer: the loss is NaN (GroupNorm of ±inf)


def engine_for(stages: int, workers: int, compensator: str = "none", **plan_kw: object) -> StreamEngine:
    plan = make_plan(stages, workers, num_units=3, **plan_kw)  # type: ignore[arg-type]
    units = tiny_units(num_units=plan.partition.num_units)
    settings = EngineSettings(lr=0.05, compensator=compensator, measure_memory=False)
    return StreamEngine(units, FerretPolicy(plan).setup("tiny", len(units), 3.0), settings)


def finite_weights(engine: StreamEngine) -> bool:
    return all(bool(torch.isfinite(t).all()) for stage in engine.pipeline.master_state() for t in stage.values())


def poisoned(items: list[Item], at: set[int]) -> list[Item]:
    return [Item(torch.full_like(it.x, HUGE), it.y) if i in at else it for i, it in enumerate(items)]


@pytest.mark.parametrize("compensator", ["none", "iter-fisher"])
@pytest.mark.parametrize("stages,workers,accumulation", [(1, 1, 1), (3, 2, 1), (3, 2, 2)])
def test_a_non_finite_loss_skips_the_item_and_never_reaches_the_weights(
    compensator: str, stages: int, workers: int, accumulation: int
) -> None:
    bad = {3, 10, 11, 25}
    engine = engine_for(stages, workers, compensator, accumulation=accumulation)
    r = engine.run_virtual(poisoned(stream(40), bad), uniform_times(stages), arrival_interval=3.0)
    assert r.skipped[SkipReason.NON_FINITE.value] == len(bad)  # once per item, whatever the stages
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items == 40
    assert finite_weights(engine)
    assert sum(r.updates_per_stage) > 0  # the good items still train


def test_the_same_stream_without_the_check_would_poison_the_weights() -> None:
    """The red half: a plain SGD step on a poisoned item would write NaN into the weights."""
    units = tiny_units(num_units=3)
    model = torch.nn.Sequential(*units)
    x = torch.full((1, 6), HUGE)
    loss = torch.nn.functional.cross_entropy(model(x), torch.tensor([1]))
    grads = torch.autograd.grad(loss, list(model.parameters()))
    assert not all(math.isfinite(float(g.abs().max())) for g in grads)


def test_on_the_wall_clock_too() -> None:
    engine = engine_for(2, 2)
    items = poisoned(stream(30), {0, 7})
    r = engine.run_wall(items, arrival_interval=0.002)
    admitted_bad = {e.item for e in r.trace or ()} & {0, 7}  # on a busy machine one may be skipped busy
    assert admitted_bad and r.skipped[SkipReason.NON_FINITE.value] == len(admitted_bad)
    assert finite_weights(engine)


def test_a_compensation_that_turns_non_finite_drops_that_gradient_only() -> None:
    engine = engine_for(1, 1)
    compensator = engine.pipeline.compensators[0]
    real = compensator.compensate
    calls = {"n": 0}

    def flaky(grads, **kw):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        out = real(grads, **kw)
        return [torch.full_like(g, float("inf")) for g in out] if calls["n"] == 2 else out

    compensator.compensate = flaky  # type: ignore[method-assign]
    r = engine.run_virtual(stream(6), uniform_times(1), arrival_interval=3.0)
    assert r.skipped[SkipReason.NON_FINITE.value] == 1
    assert sum(r.updates_per_stage) == 5  # the update that had only that gradient was not made
    assert finite_weights(engine)


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_registered_method_drops_a_non_finite_gradient(name: str) -> None:
    """The schedules keep gradients through their own paths (flush accumulation, ZB's W): the drop holds
    there too, counted once per item, and a flush group left without finite gradients still closes."""
    bad = {2, 9, 10, 17}
    plan = make_plan(3, 2, num_units=3)
    units = tiny_units(num_units=plan.partition.num_units)
    policy = make_policy(name, plan if METHODS[name].needs_plan else None)
    engine = StreamEngine(units, policy.setup("tiny", len(units), 3.0), EngineSettings(lr=0.05, measure_memory=False))
    stages = engine.setup.plan.partition.num_stages
    # a mini-batch step of b items (the buffering methods) takes b times one item's time
    times = dataclasses.replace(uniform_times(stages), per_batch=lambda b: ((1.0 * b,) * stages, (2.0 * b,) * stages))
    r = engine.run_virtual(poisoned(stream(30), bad), times, arrival_interval=3.0)
    admitted_bad = {e.item for e in r.trace or ()} & bad  # some may be skipped busy before any action
    assert admitted_bad
    dropped = r.skipped.get(SkipReason.NON_FINITE.value, 0)
    if name in BUFFERING:  # a mini-batch step with a poisoned sample drops the whole step, each of its samples
        assert dropped >= 1
    else:
        assert dropped == len(admitted_bad)
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items == 30
    assert finite_weights(engine)
    assert sum(r.updates_per_stage) > 0


@pytest.mark.parametrize(
    "name,algorithm",
    [("camel", "vanilla"), ("random-n", "er"), ("last-n", "mir"), ("oracle", "er"), ("1-skip", "mir"),
     ("random-n", "vanilla"), ("last-n", "vanilla")],
)
def test_a_poisoned_sample_is_dropped_once_and_never_replayed(name: str, algorithm: str) -> None:
    """Camel's buffer and ER/MIR's reservoir keep samples for later steps: a sample whose step is
    non-finite is evicted there, so exactly one step is dropped, its stream samples counted
    ``non_finite`` once, and the stream trains on. (Before the eviction every later step that replayed
    the sample was dropped too: Camel stopped learning.) The B-Skip window is emptied at each draw, so
    Random-N and Last-N never train a sample twice in the first place."""
    buffering = BufferingSettings(batch=2, window=4)
    options = MethodOptions(buffering=buffering)
    plan = make_plan(1, 1, num_units=3)
    units = tiny_units(num_units=3)
    policy = make_policy(name, plan if METHODS[name].needs_plan else None, options=options)
    engine = StreamEngine(
        units,
        policy.setup("tiny", len(units), 3.0),
        EngineSettings(lr=0.05, measure_memory=False),
        algorithm=make_algorithm(algorithm, AlgorithmSettings(buffer_size=40)),
    )
    # steps faster than arrivals: every sample is trained (the poisoned one too), none skipped busy
    times = dataclasses.replace(uniform_times(1), per_batch=lambda b: ((0.1 * b,), (0.2 * b,)))
    r = engine.run_virtual(poisoned(stream(120), {5}), times, arrival_interval=3.0)  # 1-skip trains 5
    steps = sum(1 for e in r.trace or () if e.kind is Kind.B)  # one stage: one B per step
    assert steps - sum(r.updates_per_stage) == 1  # one dropped step: no update from it
    per_step = buffering.batch if name in BUFFERING else 1
    assert r.skipped[SkipReason.NON_FINITE.value] == per_step
    assert r.trained_any_stage + sum(r.skipped.values()) == r.items == 120
    assert finite_weights(engine)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(width=32, allow_nan=True, allow_infinity=True), min_size=0, max_size=6),
        min_size=0,
        max_size=4,
    )
)
def test_all_finite_agrees_with_an_elementwise_check(values: list[list[float]]) -> None:
    """The check (sum fast path, aminmax ends) says what ``isfinite(t).all()`` on every tensor says."""
    tensors = [torch.tensor(v, dtype=torch.float32) for v in values]
    expected = all(bool(torch.isfinite(t).all()) for t in tensors)
    assert all_finite(tensors) is expected
    assert all_finite([t.reshape(-1, 1) for t in tensors]) is expected
    assert _all_finite_exact(tensors) is expected


def test_all_finite_is_exact_when_finite_values_overflow_the_sum() -> None:
    """The fast path's sum overflows on large finite values: the exact check answers (finite), and a
    non-finite element is still found among them; mixed dtypes are summed in float64."""
    big = torch.full((4,), 3e38, dtype=torch.float32)
    assert math.isinf(float(big.sum()))
    assert all_finite([big, -big, big]) is True
    assert all_finite([big, torch.tensor([1.0, float("nan")])]) is False
    assert all_finite([big, torch.tensor([float("-inf")])]) is False
    assert all_finite([torch.ones(3, dtype=torch.float64), torch.ones(2, dtype=torch.float16)]) is True
    assert all_finite([torch.ones(3, dtype=torch.float64), torch.tensor([float("inf")], dtype=torch.float16)]) is False
