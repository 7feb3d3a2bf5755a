"""Random-N / Last-N B-Skip and Camel over the engine: the literal schedule, the mini-batch step, skip
accounting, Camel's coreset and buffer, budgets."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ferret_core.engine import EngineSettings, StreamEngine, simulate, validate_trace
from ferret_core.engine.buffering import (
    BufferingPolicy,
    BufferingSettings,
    CamelFeeder,
    buffering_bytes,
    fit_batch,
)
from ferret_core.engine.coreset import RepresentativeBuffer, select_coreset
from ferret_core.engine.method_registry import MethodOptions, make_policy
from ferret_core.errors import ConfigError, InfeasibleBudgetError
from ferret_core.ocl import AlgorithmSettings, make_algorithm
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.schedule.stage_times import StageTimes
from tests.unit.test_engine_support import IN_FEATURES, sequential_model, stream, tiny_units


def batch_profile(units: int = 3) -> ModelProfile:
    """t_f = 1, t_b = 2 per unit for one item; 2 and 4 for a step of 4; 4 and 8 for 20."""
    layers = tuple(
        LayerProfile(f"u{i}", 1.0, 2.0, 100, 8, saved=10, batch_times=((4, 2.0, 4.0), (20, 4.0, 8.0)))
        for i in range(units)
    )
    return ModelProfile("tiny", (IN_FEATURES,), layers)


def run(method: str, n: int, *, batch: int = 4, window: int = 8, seed: int = 0, **kw: object) -> StreamEngine:
    profile = batch_profile()
    policy = BufferingPolicy(method, BufferingSettings(batch=batch, window=window, seed=seed, **kw), profile=profile)
    units = tiny_units()
    setup = policy.setup("tiny", len(units), 1.0)
    engine = StreamEngine(units, setup, EngineSettings())
    engine.run_virtual(stream(n), StageTimes.from_profile(profile, setup.plan.partition), 1.0)
    return engine


def test_last_n_literal_schedule() -> None:
    # a step of 4 takes F 3×2 + B 3×4 = 18; items arrive every 1.0; the window keeps the newest 8
    engine = run("last-n", 40)
    r = engine.result(wall_seconds=0.0)
    assert r.trace is not None
    steps = [(e.item, e.start, e.end) for e in r.trace if e.kind.value == "F"]
    # items 0–3 at t = 3; at t = 21 the window holds 13–20 (4–12 evicted), the newest 4 end at item 20;
    # at t = 39 the window holds 31–38 (21–30 evicted), newest 4 end at 38; item 39 is left at the end
    assert steps == [(3, 3.0, 9.0), (20, 21.0, 27.0), (38, 39.0, 45.0)]
    assert r.trained == 12
    assert {k: v for k, v in r.skipped.items() if v} == {"evicted": 19, "not_selected": 8, "stream_end": 1}
    assert r.items == r.trained_any_stage + sum(r.skipped.values())
    validate_trace(r.trace, engine.setup.plan)


def test_mini_batch_step_is_one_sgd_step_on_the_batch_mean() -> None:
    engine = run("random-n", 4)  # exactly one step of items 0–3, every item drawn
    units = tiny_units()
    reference = sequential_model(units)
    items = stream(4)
    x = torch.stack([i.x for i in items])
    y = torch.tensor([i.y for i in items])
    loss = nn.functional.cross_entropy(reference(x), y)
    grads = torch.autograd.grad(loss, list(reference.parameters()))
    expected = [p.detach() - 1e-3 * g for p, g in zip(reference.parameters(), grads, strict=True)]
    got = [t for stage in engine.pipeline.master_state() for name, t in stage.items() if "running" not in name]
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e)


def _masters(engine: StreamEngine) -> list[torch.Tensor]:
    return [t for stage in engine.pipeline.master_state() for t in stage.values()]


def test_random_n_is_seeded_and_draws_differently_from_last_n() -> None:
    a, b = _masters(run("random-n", 40, seed=1)), _masters(run("random-n", 40, seed=1))
    assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    last = _masters(run("last-n", 40))
    assert not all(torch.equal(p, q) for p, q in zip(a, last, strict=True))


@settings(max_examples=15, deadline=None)
@given(
    method=st.sampled_from(["random-n", "last-n", "camel"]),
    batch=st.integers(1, 4),
    extra=st.integers(0, 6),
    n=st.integers(0, 50),
)
def test_every_item_is_trained_or_skipped_with_a_reason(method: str, batch: int, extra: int, n: int) -> None:
    engine = run(method, n, batch=batch, window=batch + extra, camel_buffer=5, camel_replay=2)
    r = engine.result(wall_seconds=0.0)
    assert r.items == n == r.trained + sum(r.skipped.values())
    assert r.trained % batch == 0
    assert r.skipped["busy"] == 0


def test_camel_step_is_the_weighted_coreset_plus_replay() -> None:
    feeder = CamelFeeder(BufferingSettings(batch=3, window=6, camel_buffer=4, camel_replay=2))
    items = stream(12)
    for i, item in enumerate(items[:6]):
        assert feeder.offer(i, item.x, item.y) == 0
    first = feeder.take()
    assert len(first.batch) == 3 and first.not_selected == 3  # empty buffer: nothing replayed yet
    assert first.batch.weights is not None and float(first.batch.weights.sum()) == pytest.approx(1.0)
    for i, item in enumerate(items[6:], start=6):
        feeder.offer(i, item.x, item.y)
    second = feeder.take()
    assert len(second.batch) == 5 and second.batch.weights is not None
    assert float(second.batch.weights.sum()) == pytest.approx(1.0)
    assert float(second.batch.weights[3:].sum()) == pytest.approx(2 / 5)  # replayed share


def test_coreset_covers_clusters_and_weights_by_coverage() -> None:
    near_a = torch.tensor([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1]])
    near_b = torch.tensor([[5.0, 5.0], [5.1, 5.0]])
    x = torch.cat([near_a, near_b])
    y = torch.zeros(5, dtype=torch.long)
    rows, weights = select_coreset(x, y, 2)
    assert {r < 3 for r in rows} == {True, False}  # one from each cluster
    by_row = dict(zip(rows, weights.tolist(), strict=True))
    assert by_row[next(r for r in rows if r < 3)] == pytest.approx(3 / 5)
    # a class is only covered by its own items
    y2 = torch.tensor([0, 0, 0, 1, 1])
    rows2, _ = select_coreset(x, y2, 2)
    assert sorted(int(y2[r]) for r in rows2) == [0, 1]
    with pytest.raises(ConfigError):
        select_coreset(x, y, 6)


@settings(max_examples=20, deadline=None)
@given(labels=st.lists(st.integers(0, 2), min_size=1, max_size=40), capacity=st.integers(1, 8))
def test_representative_buffer_bookkeeping(labels: list[int], capacity: int) -> None:
    gen = torch.Generator().manual_seed(len(labels))
    buffer = RepresentativeBuffer(capacity)
    for y in labels:
        buffer.add(torch.randn(3, generator=gen), y)
    assert buffer.size == min(len(labels), capacity)
    x, ys = buffer.state_dict()["x"][: buffer.size], buffer.state_dict()["y"][: buffer.size]
    nn_dist = buffer.state_dict()["nn_dist"][: buffer.size]
    for i in range(buffer.size):  # the incremental nearest-neighbour distances are the true ones
        same = [j for j in range(buffer.size) if j != i and ys[j] == ys[i]]
        true = min((float(torch.dist(x[i], x[j])) for j in same), default=float("inf"))
        assert float(nn_dist[i]) == pytest.approx(true, rel=1e-5)
    counts = torch.bincount(ys, minlength=3)
    seen = torch.bincount(torch.tensor(labels), minlength=3)
    # class-balanced eviction: a class keeps all it has seen, or at least every other class's count − 1
    for c in range(3):
        assert counts[c] == seen[c] or counts[c] >= int(counts.max()) - 1


def test_budget_fits_the_largest_mini_batch() -> None:
    profile = batch_profile()
    base = BufferingSettings(batch=10, window=20)
    def size(n: int) -> int:
        return buffering_bytes(profile, "last-n", BufferingSettings(batch=n, window=20))

    sizes = [size(n) for n in range(1, 11)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]  # flat while the gradient outweighs the step
    for n in (5, 8):
        fitted = fit_batch(profile, "last-n", base, size(n)).batch
        assert fitted >= n and size(fitted) <= size(n) and (fitted == 10 or size(fitted + 1) > size(n))
    assert fit_batch(profile, "last-n", base, sizes[-1] * 2).batch == 10
    assert fit_batch(profile, "camel", BufferingSettings(batch=15, window=20), 10**9).batch == 10  # 2N ≤ 20
    with pytest.raises(InfeasibleBudgetError) as info:
        fit_batch(profile, "last-n", base, sizes[0] - 1)
    assert info.value.min_feasible_bytes == sizes[0]
    policy = make_policy("camel", profile=profile, options=MethodOptions(buffering=base, budget=10**9))
    setup = policy.setup("tiny", 3, 1.0)
    assert setup.planned is not None and setup.planned.planned_bytes == buffering_bytes(profile, "camel", base)


def test_planned_and_measured_bytes_are_reported() -> None:
    r = run("camel", 30, camel_buffer=5, camel_replay=2).result(wall_seconds=0.0)
    assert r.planned_bytes is not None and r.peak_bytes is not None
    assert r.memory_breakdown["arrival_buffer"] > 0


@pytest.mark.parametrize("method", ["random-n", "last-n", "camel"])
def test_buffering_methods_on_the_wall_clock(method: str) -> None:
    setup = BufferingPolicy(method, BufferingSettings(batch=3, window=6, camel_buffer=5, camel_replay=1)).setup(
        "tiny", 3, 1.0
    )
    engine = StreamEngine(tiny_units(), setup, EngineSettings(keep_trace=True))
    with engine.wall_clock() as clock:
        arrivals = [clock.submit(item.x, item.y).result(10) for item in stream(40)]
        clock.drain(30)
    assert all(a.skipped is None for a in arrivals)  # taken by the window; the fate is decided at a draw
    c = engine.pipeline.counters
    held = len(engine.pipeline.feeder._window)  # type: ignore[union-attr]
    assert c.trained >= 3 and c.trained % 3 == 0
    assert c.items == 40 == c.trained + sum(c.skipped.values()) + held
    engine.pipeline.finish_stream()
    assert c.items == c.trained + sum(c.skipped.values())
    assert engine.pipeline.trace is not None
    validate_trace(engine.pipeline.trace, setup.plan, check_staleness=False)


def test_settings_are_validated() -> None:
    with pytest.raises(ConfigError, match="bskip-window"):
        BufferingSettings(batch=10, window=5)
    with pytest.raises(ConfigError):
        BufferingPolicy("first-n")


def test_missing_batch_time_names_the_fix() -> None:
    profile = ModelProfile("tiny", (IN_FEATURES,), tuple(LayerProfile(f"u{i}", 1.0, 2.0, 100, 8) for i in range(3)))
    policy = BufferingPolicy("last-n", BufferingSettings(batch=4, window=4))
    with pytest.raises(Exception, match="--batch-sizes 1,4"):
        simulate(copy.deepcopy(tiny_units()), policy, stream(8), model="tiny", profile=profile, arrival_interval=1.0)


@pytest.mark.parametrize("name", ["er", "mir", "lwf", "mas"])
def test_camel_refuses_an_algorithm_before_the_stream(name: str) -> None:
    policy = BufferingPolicy("camel", BufferingSettings(batch=2, window=4, camel_buffer=5))
    units = tiny_units()
    with pytest.raises(ConfigError, match="camel"):
        StreamEngine(units, policy.setup("tiny", len(units), 1.0), EngineSettings(),
                     algorithm=make_algorithm(name, AlgorithmSettings(buffer_size=5)))


@settings(max_examples=25, deadline=None)
@given(
    labels=st.lists(st.integers(0, 2), min_size=1, max_size=30),
    capacity=st.integers(1, 8),
    evictions=st.lists(st.integers(0, 29), max_size=6),
)
def test_representative_buffer_evicts_and_keeps_its_bookkeeping(
    labels: list[int], capacity: int, evictions: list[int]
) -> None:
    """A sample evicted (its step was non-finite) is no longer held nor drawn; the buffer stays compact
    and its nearest-neighbour bookkeeping true; evicting it twice, or a sample overwritten since, is a
    no-op."""
    gen = torch.Generator().manual_seed(len(labels))
    buffer = RepresentativeBuffer(capacity)
    held = [buffer.add(torch.randn(3, generator=gen), y) for y in labels]
    for k in evictions:
        h = held[k % len(held)]
        if h is None:
            continue
        before = buffer.size
        gone = buffer.evict(h.slot, h.stamp)
        assert buffer.size == before - int(gone)
        assert not buffer.evict(h.slot, h.stamp)
    state = buffer.state_dict()
    x, ys, nn_dist = state["x"], state["y"][: buffer.size], state["nn_dist"][: buffer.size]
    assert bool((ys >= 0).all())  # no hole: every drawn row is a real sample
    for i in range(buffer.size):
        same = [j for j in range(buffer.size) if j != i and ys[j] == ys[i]]
        true = min((float(torch.dist(x[i], x[j])) for j in same), default=float("inf"))
        assert float(nn_dist[i]) == pytest.approx(true, rel=1e-5)
    assert len(set(state["stamps"][: buffer.size])) == buffer.size  # stamps stay unique
    drawn_x, drawn_y, drawn_held = buffer.sample(capacity)
    assert len(drawn_held) == buffer.size == int(drawn_y.shape[0])
    for h, row in zip(drawn_held, drawn_x, strict=True):
        assert torch.equal(x[h.slot], row)
