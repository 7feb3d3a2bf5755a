"""Transparency (STYLE lesson 5): the engine equals plain sequential training where it must."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from ferret_core.compensation import COMPENSATOR_NAMES
from ferret_core.engine import EngineSettings, FerretPolicy, Oracle, StreamEngine
from ferret_core.engine.stage_exec import backward, build_stages, forward_with_grad
from ferret_core.plan import Partition
from tests.unit.test_engine_support import (
    make_plan,
    run_plan,
    sequential_model,
    stream,
    tiny_units,
    uniform_times,
)

EXACT = {"rtol": 0.0, "atol": 0.0}


def plain_sgd(units: list[torch.nn.Module], items: list, lr: float) -> dict[str, torch.Tensor]:
    """The reference: predict, then one SGD step per item, in place, on an ordinary module."""
    model = sequential_model(units)
    params = list(model.parameters())
    for item in items:
        x = item.x.unsqueeze(0)
        with torch.no_grad():
            model(x)
        loss = F.cross_entropy(model(x), torch.tensor([item.y]))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=lr)
    return {k: v.detach() for k, v in model.state_dict().items()}


def test_oracle_equals_plain_sgd_loop() -> None:
    units, items = tiny_units(), stream(40)
    setup = Oracle().setup("tiny", len(units), arrival_interval=1.0)
    engine = StreamEngine(units, setup, EngineSettings(lr=0.05))
    result = engine.run_virtual(items, None, arrival_interval=1.0)
    assert result.trained == 40 and result.updates_per_stage == (40,)
    assert_close(engine.pipeline.master_state()[0], plain_sgd(units, items, 0.05), **EXACT)


def test_one_worker_one_stage_plan_equals_plain_sgd_loop_when_time_allows() -> None:
    units, items = tiny_units(), stream(30)
    plan = make_plan(1, 1, num_units=3)
    engine, result = run_plan(plan, items, units=units, arrival=3.0, lr=0.05)
    assert result.skipped["busy"] == 0 and result.trained == 30
    assert_close(engine.pipeline.master_state()[0], plain_sgd(units, items, 0.05), **EXACT)


def test_oracle_prediction_counts_before_training() -> None:
    units, items = tiny_units(), stream(25)
    model = sequential_model(units)
    params = list(model.parameters())
    correct = 0
    for item in items:
        x = item.x.unsqueeze(0)
        with torch.no_grad():
            correct += int(model(x).argmax(1).item() == item.y)
        grads = torch.autograd.grad(F.cross_entropy(model(x), torch.tensor([item.y])), params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=0.05)
    setup = Oracle().setup("tiny", len(units), arrival_interval=1.0)
    result = StreamEngine(units, setup, EngineSettings(lr=0.05)).run_virtual(items, None, 1.0)
    assert result.oacc == pytest.approx(100.0 * correct / len(items))


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_zero_staleness_makes_every_compensator_the_identity(name: str) -> None:
    units, items = tiny_units(), stream(20)
    plan = make_plan(1, 1, num_units=3)
    ref, _ = run_plan(plan, items, units=units, arrival=3.0, lr=0.05, compensator="none")
    eng, result = run_plan(plan, items, units=units, arrival=3.0, lr=0.05, compensator=name)
    assert result.max_staleness == (0,)
    assert_close(eng.pipeline.master_state(), ref.pipeline.master_state(), **EXACT)


def test_split_stages_give_the_unsplit_gradients() -> None:
    units = tiny_units(num_units=4)
    x, y = torch.randn(1, 6), torch.tensor([2])
    whole, (v_whole,) = build_stages(units, Partition((0, 4)))
    split, versions = build_stages(units, Partition((0, 1, 3, 4)))
    graph = forward_with_grad(whole[0].runner(), v_whole, x, input_grad=False)
    reference, _ = backward(graph, target=y)

    graphs = []
    h = x
    for j, (program, version) in enumerate(zip(split, versions, strict=True)):
        graphs.append(forward_with_grad(program.runner(), version, h, input_grad=j > 0))
        h = graphs[-1].output.detach()
    grads: list[tuple[torch.Tensor, ...]] = []
    grad_out = None
    for j in reversed(range(len(split))):
        if j == len(split) - 1:
            g, grad_out = backward(graphs[j], target=y)
        else:
            g, grad_out = backward(graphs[j], grad_output=grad_out)
        grads.insert(0, g)
    assert grad_out is None  # stage 0 does not ask for its input's gradient
    assert_close([t for g in grads for t in g], list(reference), **EXACT)


def test_versions_are_never_written_in_place() -> None:
    units, items = tiny_units(), stream(12)
    plan = make_plan(3, 2)
    setup = FerretPolicy(plan).setup("tiny", len(units), 1.0)
    engine = StreamEngine(units, setup)
    version0 = engine.pipeline.store.masters()
    kept = [[t.clone() for t in v.tensors()] for v in version0]
    engine.run_virtual(items, uniform_times(3), 1.0)
    assert all(v.version > 0 for v in engine.pipeline.store.masters())
    for version, copies in zip(version0, kept, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(version.tensors(), copies, strict=True))


def test_buffers_are_versioned_with_parameters() -> None:
    units = tiny_units()
    units[0].register_buffer("scale", torch.full((1,), 2.0))

    class Scaled(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner
            self.register_buffer("scale", torch.full((1,), 0.5))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x) * self.scale

    units[1] = Scaled(units[1])
    engine, result = run_plan(make_plan(3, 2), stream(10), units=units)
    state = engine.pipeline.master_state()
    assert torch.equal(state[1]["0.scale"], torch.full((1,), 0.5))
    assert result.trained > 0


def test_updates_write_in_place_only_when_nothing_else_reads_the_master() -> None:
    units, items = tiny_units(), stream(15)
    engine = StreamEngine(units, Oracle().setup("tiny", len(units), 1.0), EngineSettings(lr=0.05))
    version0 = engine.pipeline.store.master(0)  # an outside holder: the first update must not overwrite it
    kept = [t.clone() for t in version0.tensors()]
    result = engine.run_virtual(items, None, 1.0)
    assert engine.pipeline.counters.in_place_updates == result.updates_per_stage[0] - 1
    assert all(torch.equal(a, b) for a, b in zip(version0.tensors(), kept, strict=True))
    assert_close(engine.pipeline.master_state()[0], plain_sgd(units, items, 0.05), **EXACT)
