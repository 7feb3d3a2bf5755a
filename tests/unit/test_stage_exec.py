"""A stage runner binds a version's tensors for one call: its outputs and gradients are those of
``torch.func.functional_call`` on the same tensors, and it keeps no reference to them afterwards."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch.func import functional_call

from ferret_core.engine.stage_exec import backward, build_stages, forward_with_grad
from ferret_core.errors import ScheduleError
from ferret_core.plan import Partition
from ferret_core.zoo import build_model


@pytest.mark.parametrize(("name", "shape"), [("mlp", (3, 1, 28, 28)), ("mnistnet", (2, 1, 28, 28))])
def test_runner_matches_functional_call_forward_and_gradients(name: str, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    zoo = build_model(name)
    units = list(zoo.units)
    cut = max(1, len(units) // 2)
    partition = Partition((0, cut, len(units)))
    programs, versions = build_stages(units, partition)
    x = torch.randn(*shape)
    target = torch.tensor([1] * shape[0])
    h = x
    for program, version in zip(programs, versions, strict=True):
        runner = program.runner()
        mapping = dict(zip(program.param_names, version.params, strict=True))
        mapping.update(zip(program.buffer_names, version.buffers, strict=True))
        with torch.no_grad():
            expected = functional_call(runner.module, mapping, (h,))
            got = runner(version.params, version.buffers, h)
        assert torch.equal(got, expected)
        graph = forward_with_grad(runner, version, h, input_grad=False)
        leaves = tuple(p.detach().requires_grad_(True) for p in version.params)
        ref_map = dict(zip(program.param_names, leaves, strict=True))
        ref_map.update(zip(program.buffer_names, version.buffers, strict=True))
        ref_out = functional_call(runner.module, ref_map, (h.detach(),))
        assert torch.equal(graph.output, ref_out)
        if program is programs[-1]:
            grads, _ = backward(graph, target=target)
            ref = torch.autograd.grad(torch.nn.functional.cross_entropy(ref_out, target), leaves)
            assert all(torch.equal(a, b) for a, b in zip(grads, ref, strict=True))
        h = got


def test_runner_keeps_no_reference_to_the_tensors_after_a_call() -> None:
    zoo = build_model("mlp")
    programs, versions = build_stages(list(zoo.units), Partition((0, zoo.num_units)))
    runner = programs[0].runner()
    params = tuple(p.clone() for p in versions[0].params)
    refs = [weakref.ref(p) for p in params]
    runner(params, versions[0].buffers, torch.randn(1, 1, 28, 28))
    del params
    gc.collect()
    assert all(r() is None for r in refs)
    assert all(p.is_meta for p in runner.module.parameters())


def test_runner_refuses_the_wrong_number_of_tensors() -> None:
    zoo = build_model("mlp")
    programs, versions = build_stages(list(zoo.units), Partition((0, zoo.num_units)))
    with pytest.raises(ScheduleError, match="parameters"):
        programs[0].runner()(versions[0].params[:-1], versions[0].buffers, torch.randn(1, 1, 28, 28))
    runner = programs[0].runner()
    assert all(p.is_meta for p in runner.module.parameters())
