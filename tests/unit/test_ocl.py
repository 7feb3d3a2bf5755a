"""OCL algorithms over the engine: the reservoir's invariant, each algorithm against a plain reference,
their state in the memory meter, snapshots, and every method × algorithm on a tiny stream."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ferret_core.engine import EngineSettings, FerretPolicy, OneSkip, Oracle, StreamEngine, simulate, validate_trace
from ferret_core.engine.buffering import BufferingPolicy, BufferingSettings
from ferret_core.engine.policies import Policy
from ferret_core.engine.steps import Batch
from ferret_core.errors import ConfigError
from ferret_core.ocl import ALGORITHM_NAMES, AlgorithmSettings, make_algorithm
from ferret_core.ocl.algorithms import LearningWithoutForgetting, MaximallyInterferedRetrieval, MemoryAwareSynapses
from ferret_core.ocl.losses import distillation_loss, interference
from ferret_core.ocl.reservoir import ReservoirBuffer
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import LayerProfile, ModelProfile
from tests.unit.test_engine_support import CLASSES, IN_FEATURES, sequential_model, stream, tiny_units

SMALL = AlgorithmSettings(buffer_size=12, replay_batch=3, mir_candidates=6, lwf_every=8, mas_every=5)


def batch_profile() -> ModelProfile:
    layers = tuple(
        LayerProfile(f"u{i}", 1.0, 2.0, 100, 8, saved=10, batch_times=((20, 4.0, 8.0),)) for i in range(3)
    )
    return ModelProfile("tiny", (IN_FEATURES,), layers)


def oracle_engine(algorithm_name: str, settings: AlgorithmSettings = SMALL) -> StreamEngine:
    units = tiny_units()
    setup = Oracle().setup("tiny", len(units), 1.0)
    return StreamEngine(units, setup, EngineSettings(), algorithm=make_algorithm(algorithm_name, settings))


def as_batch(items: list, rows: range) -> Batch:  # type: ignore[type-arg]
    return Batch.stack([items[i].x for i in rows], [items[i].y for i in rows])


# --------------------------------------------------------------------------------------------- reservoir
@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 10), added=st.integers(0, 40), seed=st.integers(0, 5))
def test_reservoir_holds_min_of_seen_and_capacity(capacity: int, added: int, seed: int) -> None:
    buffer = ReservoirBuffer(capacity, seed=seed)
    xs = torch.arange(added, dtype=torch.float32).reshape(added, 1)
    if added:
        buffer.add(Batch(xs, torch.zeros(added, dtype=torch.long)))
    assert buffer.size == min(added, capacity) and buffer.seen == added
    held = buffer.sample(capacity)
    if added:
        assert held is not None
        values = held.x.flatten().tolist()
        assert len(set(values)) == len(values) == min(added, capacity) and all(0 <= v < added for v in values)


def test_reservoir_keeps_every_sample_with_equal_probability() -> None:
    counts = torch.zeros(20)
    for seed in range(1500):
        buffer = ReservoirBuffer(5, seed=seed)
        for i in range(20):  # one at a time, as steps arrive
            buffer.add(Batch(torch.tensor([[float(i)]]), torch.tensor([0])))
        held = buffer.sample(5)
        assert held is not None
        counts[held.x.flatten().long()] += 1
    freq = counts / 1500
    assert float(freq.min()) > 0.25 - 0.06 and float(freq.max()) < 0.25 + 0.06  # min(1, 5/20) each


def test_reservoir_evicts_a_sample_by_its_stamp_wherever_it_moved() -> None:
    buffer = ReservoirBuffer(4, seed=0)
    held = buffer.add(Batch(torch.arange(4, dtype=torch.float32).reshape(4, 1), torch.zeros(4, dtype=torch.long)))
    assert [h.slot for h in held if h is not None] == [0, 1, 2, 3]
    first, second = held[0], held[1]
    assert first is not None and second is not None
    assert buffer.evict(first.slot, first.stamp) and buffer.size == 3  # the last sample moved into slot 0
    assert not buffer.evict(first.slot, first.stamp)
    assert buffer.evict(second.slot, second.stamp) and buffer.size == 2
    drawn = buffer.sample(4)
    assert drawn is not None and sorted(drawn.x.flatten().tolist()) == [2.0, 3.0]
    assert all(h is not None and h.buffer is buffer for h in drawn.held)
    late = buffer.add(Batch(torch.tensor([[9.0]]), torch.tensor([0])))[0]  # refills the hole first
    assert late is not None and late.slot == 2 and buffer.size == 3


# ---------------------------------------------------------------------------------------------------- ER
def test_er_step_replays_then_stores() -> None:
    engine = oracle_engine("er")
    algorithm = engine.pipeline.algorithm
    items = stream(10)
    first = algorithm.step(as_batch(items, range(0, 2)))
    assert len(first.batch) == 2 and first.samples == 2 and first.batch.replayed == 0  # empty buffer
    second = algorithm.step(as_batch(items, range(2, 3)))
    assert len(second.batch) == 3 and second.samples == 1 and second.shape.batch == 3  # 1 new + 2 held
    assert algorithm.footprint.replay_items == 12 and algorithm.footprint.replayed(5) == 3


def test_er_replays_as_many_as_admitted_by_default() -> None:
    engine = oracle_engine("er", AlgorithmSettings(buffer_size=12))
    algorithm = engine.pipeline.algorithm
    items = stream(10)
    algorithm.step(as_batch(items, range(0, 4)))
    assert len(algorithm.step(as_batch(items, range(4, 5))).batch) == 2  # 1 admitted + 1 replayed
    assert len(algorithm.step(as_batch(items, range(5, 8))).batch) == 6  # 3 + 3
    assert algorithm.steady_shape(10).batch == 20 and algorithm.footprint.replayed(10) == 10
    mir = make_algorithm("mir", AlgorithmSettings())
    assert mir.steady_shape(1).overhead == ((1, True), (5, False), (5, False))  # 5 candidates for 1 replayed


# --------------------------------------------------------------------------------------------------- MIR
def test_mir_replays_the_most_interfered_candidates() -> None:
    settings = AlgorithmSettings(buffer_size=6, replay_batch=2, mir_candidates=6)
    engine = oracle_engine("mir", settings)
    algorithm = engine.pipeline.algorithm
    assert isinstance(algorithm, MaximallyInterferedRetrieval)
    items = stream(8)
    algorithm.buffer.add(as_batch(items, range(6)))
    new = as_batch(items, range(6, 8))
    step = algorithm.step(new)
    # reference: a plain model, a virtual SGD step on the new items, the loss rise of every held item
    model = sequential_model(tiny_units())
    loss = nn.functional.cross_entropy(model(new.x), new.y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    virtual = copy.deepcopy(model)
    with torch.no_grad():
        for p, g in zip(virtual.parameters(), grads, strict=True):
            p.sub_(1e-3 * g)
        held = as_batch(items, range(6))
        rise = (nn.functional.cross_entropy(virtual(held.x), held.y, reduction="none")
                - nn.functional.cross_entropy(model(held.x), held.y, reduction="none"))
    expected = {tuple(held.x[i].tolist()) for i in torch.topk(rise, 2).indices.tolist()}
    assert {tuple(row.tolist()) for row in step.batch.x[2:]} == expected
    assert step.shape.overhead == ((2, True), (6, False), (6, False)) and step.shape.batch == 4


def test_interference_orders_by_rise() -> None:
    assert interference(torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.5, 3.0, 1.5]), 2).tolist() == [1, 0]


# --------------------------------------------------------------------------------------------------- LwF
def test_lwf_distills_from_a_refreshed_teacher_over_its_seen_classes() -> None:
    settings = AlgorithmSettings(lwf_every=4, lwf_alpha=0.5, lwf_temperature=2.0)
    engine = oracle_engine("lwf", settings)
    algorithm = engine.pipeline.algorithm
    assert isinstance(algorithm, LearningWithoutForgetting)
    items = [it for it in stream(40) if it.y in (0, 1)][:4] + [it for it in stream(40) if it.y == 2][:2]
    before = algorithm.step(as_batch(items, range(4)))  # no teacher yet: plain cross-entropy
    assert before.shape.forward_passes == 1
    after = algorithm.step(as_batch(items, range(4, 6)))  # 4 items trained → the teacher is the master
    assert after.shape.forward_passes == 2
    model = sequential_model(tiny_units())
    out = torch.randn(2, CLASSES)
    new = as_batch(items, range(4, 6))
    with torch.no_grad():
        teacher = model(new.x)
    classes = torch.tensor(sorted({it.y for it in items[:4]}))
    expected = nn.functional.cross_entropy(out, new.y) + 0.5 * distillation_loss(out, teacher, 2.0, classes)
    torch.testing.assert_close(after.loss(out), expected)


# --------------------------------------------------------------------------------------------------- MAS
def test_mas_importance_and_penalty() -> None:
    settings = AlgorithmSettings(mas_every=2, mas_lambda=3.0, mas_alpha=0.5)
    engine = oracle_engine("mas", settings)
    algorithm = engine.pipeline.algorithm
    assert isinstance(algorithm, MemoryAwareSynapses)
    items = stream(4)
    step = algorithm.step(as_batch(items, range(2)))
    assert step.shape.overhead == ((2, True),)
    model = sequential_model(tiny_units())
    x = as_batch(items, range(2)).x
    norm = model(x).pow(2).sum(dim=1).mean()
    grads = torch.autograd.grad(norm, list(model.parameters()))
    params = engine.pipeline.store.master(0).params
    stage_grads = [torch.zeros_like(p) for p in params]
    moved = [p + 1.0 for p in params]
    out = algorithm.regularise(0, moved, stage_grads, count=2)
    n = len(params)
    for o, g in zip(out, grads[:n], strict=True):  # 2λ·count·Ω·(θ − θ*) with θ − θ* = 1, Ω = |∇|
        torch.testing.assert_close(o, 2 * 3.0 * 2 * g.abs())
    assert algorithm.regularise(0, params, stage_grads, 1)[0].abs().sum() == 0  # at the anchor


# ------------------------------------------------------------------------------------- memory, snapshot
def test_algorithm_state_is_measured() -> None:
    r = simulate(tiny_units(), Oracle(), stream(30), model="tiny", profile=batch_profile(), arrival_interval=1.0,
                 algorithm=make_algorithm("er", SMALL))
    assert r.algorithm == "er"
    assert r.memory_breakdown["algorithm"] == 12 * IN_FEATURES * 4 + 12 * 8  # inputs + int64 labels


@pytest.mark.parametrize("name", ["er", "mir", "lwf", "mas"])
def test_state_round_trips(name: str) -> None:
    engine = oracle_engine(name)
    engine.run_virtual(stream(20), None, 1.0)
    state = engine.pipeline.algorithm.state_dict()
    fresh = oracle_engine(name)
    fresh.pipeline.algorithm.load_state_dict(copy.deepcopy(state))
    again = fresh.pipeline.algorithm.state_dict()
    assert json.dumps(_shape(state)) == json.dumps(_shape(again))
    with pytest.raises(ConfigError):
        oracle_engine("vanilla" if name != "vanilla" else "er").pipeline.algorithm.load_state_dict(state)


def _shape(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return [list(value.shape), float(value.float().sum())]
    if isinstance(value, dict):
        return {k: _shape(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_shape(v) for v in value]
    return value


def test_registry() -> None:
    assert ALGORITHM_NAMES == ("vanilla", "er", "mir", "lwf", "mas")
    with pytest.raises(ConfigError, match="unknown OCL algorithm"):
        make_algorithm("ewc")
    with pytest.raises(ConfigError):
        AlgorithmSettings(mir_candidates=2, replay_batch=5)


@pytest.mark.parametrize(
    "bad", [{"mas_alpha": 1.0}, {"mas_alpha": -0.1}, {"lwf_temperature": 0.0}, {"mas_lambda": float("nan")},
            {"lwf_alpha": -1.0}],
)
def test_lwf_and_mas_weights_are_validated(bad: dict[str, float]) -> None:
    """The checks of the LwF/MAS weights run at construction (they once sat after a ``return`` in
    ``candidates`` and never ran)."""
    with pytest.raises(ConfigError, match=next(iter(bad))):
        AlgorithmSettings(**bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ every method × algorithm
def policies(profile: ModelProfile) -> list[Policy]:
    plan = Planner(profile, PlannerSettings(arrival_interval=1.0)).plan(None)
    return [Oracle(), OneSkip(), FerretPolicy(plan),
            BufferingPolicy("random-n", BufferingSettings(batch=2, window=5), profile=profile),
            BufferingPolicy("last-n", BufferingSettings(batch=2, window=5), profile=profile)]


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_method_composes_with_every_algorithm(name: str) -> None:
    profile = batch_profile()
    for policy in policies(profile):
        runs = [
            simulate(tiny_units(), policy, stream(30), model="tiny", profile=profile, arrival_interval=1.0,
                     algorithm=make_algorithm(name, SMALL))
            for _ in range(2)
        ]
        r = runs[0]
        assert r.items == 30 == r.trained_any_stage + sum(r.skipped.values()), policy.name
        assert r.trace is not None
        validate_trace(r.trace, policy.setup("tiny", 3, 1.0).plan, check_staleness=False)
        a, b = (dict(x.to_dict(), wall_seconds=0) for x in runs)
        assert a == b, f"{policy.name} + {name} is not reproducible"
