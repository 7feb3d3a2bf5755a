"""The wall clock: real executor threads driven by the same scheduler; failures reach the caller."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from ferret_core.engine import EngineSettings, FerretPolicy, Kind, StreamEngine, validate_trace
from ferret_core.engine.wall_clock import ClockStopped
from tests.unit.test_engine_support import make_plan, sequential_model, stream, tiny_units, uniform_times


def engine_for(plan, units=None, **settings: object) -> StreamEngine:  # type: ignore[no-untyped-def]
    units = units if units is not None else tiny_units(num_units=plan.partition.num_units)
    return StreamEngine(units, FerretPolicy(plan).setup("tiny", len(units), 0.0), EngineSettings(**settings))  # type: ignore[arg-type]


def test_wall_clock_runs_the_schedule_and_its_trace_is_valid() -> None:
    plan = make_plan(3, 2, recompute=[True, False], accumulation=[[1, 2, 1], [2, 1, 1]])
    engine = engine_for(plan)
    r = engine.run_wall(stream(40), arrival_interval=0.002)
    assert r.items == 40 and r.trained + sum(r.skipped.values()) == 40 and r.trained > 0
    assert r.trace is not None
    validate_trace(r.trace, plan, check_staleness=False)
    for n in range(2):
        for j in range(3):
            assert r.updates[n][j] == r.backwards[n][j] // plan.workers[n].accumulation[j]
            assert r.recomputes[n][j] == (r.backwards[n][j] if plan.workers[n].recompute else 0)
    assert r.peak_bytes is not None and r.peak_bytes > 0


def test_one_worker_one_stage_on_the_wall_clock_equals_plain_sgd_on_the_items_it_trained() -> None:
    units, items = tiny_units(), stream(30)
    engine = engine_for(make_plan(1, 1, num_units=3), units, lr=0.05)
    r = engine.run_wall(items, arrival_interval=0.003)
    assert r.trace is not None
    trained = [e.item for e in r.trace if e.kind is Kind.B]
    assert len(trained) == r.trained > 0
    assert_close(engine.pipeline.master_state()[0], _plain_sgd_on(units, items, trained, 0.05), rtol=0.0, atol=0.0)


class Boom(nn.Module):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.after = after
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if self.calls > self.after:
            raise ValueError("boom in stage 1")
        return self.linear(x)


def test_the_first_exception_of_an_executor_thread_is_raised_in_the_caller() -> None:
    units = tiny_units()
    units[1] = Boom(after=3)
    engine = engine_for(make_plan(3, 2), units)
    with pytest.raises(ValueError, match="boom in stage 1"):
        engine.run_wall(stream(30), arrival_interval=0.002)


def test_submit_after_close_and_drain_timeout() -> None:
    engine = engine_for(make_plan(2, 1))
    clock = engine.wall_clock()
    with clock:
        arrival = clock.submit(stream(1)[0].x, 1).result(timeout=10)
        assert arrival.index == 0 and arrival.skipped is None
        clock.drain(timeout=10)
    with pytest.raises(ClockStopped):
        clock.submit(stream(1)[0].x, 1)


def test_submitted_item_numbers_pick_the_worker_slot() -> None:
    engine = engine_for(make_plan(2, 3))
    with engine.wall_clock() as clock:
        futures = [clock.submit(item.x, item.y, index=100 + i) for i, item in enumerate(stream(6))]
        clock.drain(timeout=10)
    arrivals = [f.result() for f in futures]
    assert [a.index for a in arrivals] == list(range(100, 106))
    assert all(0.0 < a.confidence <= 1.0 for a in arrivals)
    admitted = [a.index for a in arrivals if a.skipped is None]
    assert engine.pipeline.counters.admitted == [sum(i % 3 == n for i in admitted) for n in range(3)]


def test_unlabelled_arrivals_are_predicted_and_skipped() -> None:
    engine = engine_for(make_plan(2, 2))
    with engine.wall_clock() as clock:
        futures = [clock.submit(item.x, None) for item in stream(5)]
        clock.drain(timeout=10)
    assert [f.result().skipped.value for f in futures] == ["no_label"] * 5  # type: ignore[union-attr]
    assert engine.pipeline.counters.trained == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_wall_clock_on_cuda_streams_matches_the_trace_replay_invariants() -> None:
    plan = make_plan(3, 2)
    devices = [torch.device("cuda", j % torch.cuda.device_count()) for j in range(3)]
    units = tiny_units()
    engine = StreamEngine(units, FerretPolicy(plan).setup("tiny", 3, 0.0), devices=devices)
    r = engine.run_wall(stream(40), arrival_interval=0.002)
    assert r.trace is not None and r.trained > 0
    validate_trace(r.trace, plan, check_staleness=False)
    assert r.cuda_peak_bytes is not None and r.cuda_peak_bytes > 0



CUDA = pytest.param("cuda", marks=[
    pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
])


@pytest.mark.parametrize("device", ["cpu", CUDA])
@pytest.mark.parametrize("stages", [1, 3])
def test_one_worker_without_staleness_equals_plain_sgd_on_the_cpu(device: str, stages: int) -> None:
    """Transparency on each device: one worker over 1 or 3 stages, each item drained before the next (no
    staleness), ends with plain CPU SGD's weights on the same items (float tolerance: CUDA kernels sum in
    another order)."""
    units, items = tiny_units(), stream(20)
    plan = make_plan(stages, 1, num_units=3)
    engine = StreamEngine(
        units,
        FerretPolicy(plan).setup("tiny", 3, 0.0),
        EngineSettings(lr=0.05),
        devices=[torch.device(device)] * stages,
    )
    with engine.wall_clock() as clock:
        futures = []
        for item in items:
            futures.append(clock.submit(item.x, item.y))
            clock.drain(timeout=30)
    assert all(f.result().skipped is None for f in futures)
    merged = {}
    offset = 0
    for state, program in zip(engine.pipeline.master_state(), engine.pipeline.programs, strict=True):
        for name, tensor in state.items():
            unit, rest = name.split(".", 1)
            merged[f"{int(unit) + offset}.{rest}"] = tensor.cpu()
        offset += len(program.template)
    expected = _plain_sgd_on(units, items, list(range(len(items))), 0.05)
    assert_close(merged, expected, rtol=1e-4, atol=1e-5)


def _plain_sgd_on(units: list[nn.Module], items: list, trained: list[int], lr: float) -> dict[str, torch.Tensor]:  # type: ignore[type-arg]
    model = sequential_model(units)
    params = list(model.parameters())
    for i in trained:
        x = items[i].x.unsqueeze(0)
        grads = torch.autograd.grad(F.cross_entropy(model(x), torch.tensor([items[i].y])), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=lr)
    return dict(model.state_dict())


@pytest.mark.parametrize("in_place", [True, False])
def test_a_plan_without_staleness_takes_the_fast_path_and_equals_the_general_one(in_place: bool) -> None:
    """1 stage × 1 worker on the wall clock with the service's compensator: nothing is stale, so compensation
    is the identity, leaves λ untouched and allocates no v_r, v_a, and updates write the master in place (the fast
    path); with in-place updates turned off (the general, out-of-place path) the parameters are
    bit-identical, both equal to plain SGD on the items trained."""
    units, items = tiny_units(), stream(30)
    engine = engine_for(make_plan(1, 1, num_units=3), units, lr=0.05, compensator="iter-fisher-lean")
    engine.pipeline.in_place = in_place
    r = engine.run_wall(items, arrival_interval=0.003)
    assert r.trace is not None
    trained = [e.item for e in r.trace if e.kind is Kind.B]
    assert len(trained) == r.trained > 0
    assert_close(engine.pipeline.master_state()[0], _plain_sgd_on(units, items, trained, 0.05), rtol=0.0, atol=0.0)
    updates = r.updates[0][0]
    if in_place:  # a prediction holding the master makes an update go out of place: most are in place
        assert engine.pipeline.counters.in_place_updates > updates // 2
    else:
        assert engine.pipeline.counters.in_place_updates == 0
    (compensator,) = engine.pipeline.compensators
    stats = compensator.stats()
    assert compensator.name == "iter-fisher-lean"
    assert stats["calls"] == updates and stats["compensated"] == 0
    state = compensator.state_dict()
    assert state["lambda"] == compensator.settings.lambda0
    assert state["v_r"] is None and state["v_a"] is None  # never stale: v_r, v_a are not even allocated


@pytest.mark.parametrize("name", ["iter-fisher", "iter-fisher-lean"])
def test_a_plan_with_staleness_still_compensates(name: str) -> None:
    plan = make_plan(3, 2)
    engine = engine_for(plan, lr=0.05, compensator=name)
    r = engine.run_virtual(stream(40), uniform_times(3), 1.0)
    assert r.trained > 0 and max(r.max_staleness) > 0
    stats = [c.stats() for c in engine.pipeline.compensators]
    assert sum(s["compensated"] for s in stats) > 0
    stale = [c for c, s in zip(engine.pipeline.compensators, stats, strict=True) if s["compensated"]]
    assert all(any(t.any() for t in c.state_dict()["v_a"]) for c in stale)  # v_a tracks the stale gradients
