"""Replay (STYLE lesson 5): the executed trace, run through an independent reference, gives the engine's
final parameters — for P = 3, N = 2, with each of T1–T4 on and off, and with each compensator."""

from __future__ import annotations

import copy
import itertools
from collections import defaultdict

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call
from torch.testing import assert_close

from ferret_core.compensation import COMPENSATOR_NAMES, CompensatorSettings, make_compensator
from ferret_core.engine import Kind, TraceEvent
from ferret_core.plan import Plan
from ferret_core.staleness import ring_capacity
from tests.unit.test_engine_support import Item, make_plan, run_plan, stream, tiny_units

LR = 0.05
SETTINGS = CompensatorSettings(eta_lambda=1e-3)  # a λ that moves, so its state matters in the replay


def replay(units: list[nn.Module], plan: Plan, items: list[Item], trace: list[TraceEvent], name: str) -> list:
    """Re-execute ``trace`` from scratch: forwards on the recorded versions, SGD updates in trace order."""
    bounds = plan.partition.boundaries
    stages = [nn.Sequential(*copy.deepcopy(units[a:b])) for a, b in itertools.pairwise(bounds)]
    names = [[k for k, _ in s.named_parameters()] for s in stages]
    versions = [{0: [p.detach().clone() for p in s.parameters()]} for s in stages]
    comps = [make_compensator(name, versions[j][0], SETTINGS, ring_capacity(plan, j)) for j in range(len(stages))]
    master = [0] * len(stages)
    inputs: dict[tuple[int, int], torch.Tensor] = {}
    grad_out: dict[tuple[int, int], torch.Tensor] = {}
    pending: dict[tuple[int, int], list] = defaultdict(list)
    last = len(stages) - 1

    def run(j: int, params: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        return functional_call(stages[j], dict(zip(names[j], params, strict=True)), (x,))

    for e in trace:
        j, key = e.stage, (e.item, e.stage)
        if e.kind is Kind.F:
            x = items[e.item].x.unsqueeze(0) if j == 0 else inputs[key]
            inputs[key] = x
            with torch.no_grad():
                inputs[(e.item, j + 1)] = run(j, versions[j][e.version_read], x)
        elif e.kind is Kind.B:
            x = inputs[key].detach().requires_grad_(True)
            params = [p.detach().requires_grad_(True) for p in versions[j][e.version_read]]
            out = run(j, params, x)
            if j == last:
                grads = torch.autograd.grad(F.cross_entropy(out, torch.tensor([items[e.item].y])), [*params, x])
            else:
                grads = torch.autograd.grad(out, [*params, x], grad_outputs=grad_out[key])
            grad_out[(e.item, j - 1)] = grads[-1]
            # compensated right away, from its read version to the master as it is at the B (T2's buffer)
            v = e.version_read
            pending[e.executor].append(comps[j].compensate(list(grads[:-1]), staleness=master[j] - v,
                                                           theta_then=versions[j][v], theta_now=versions[j][master[j]]))
        elif e.kind is Kind.U:
            total = None
            for fixed in pending.pop(e.executor):
                total = fixed if total is None else [s + g for s, g in zip(total, fixed, strict=True)]
            assert total is not None
            old = versions[j][master[j]]
            new = [torch.sub(p, g, alpha=LR) for p, g in zip(old, total, strict=True)]
            comps[j].observe_update([n - o for n, o in zip(new, old, strict=True)])
            master[j] += 1
            versions[j][master[j]] = new
    return [versions[j][master[j]] for j in range(len(stages))]


TECHNIQUES = {
    "none": {},
    "T1": {"recompute": True},
    "T2": {"accumulation": [[2, 3, 2], [3, 1, 2]]},
    "T3": {"omission": [[1, 1, 0], [2, 0, 0]]},
    "T4": {"live": [True, False]},
    "T1-T4": {"recompute": [True, False], "accumulation": [[2, 1, 2], [1, 2, 1]],
              "omission": [[0, 1, 0], [1, 0, 0]], "live": [True, True]},
}


@pytest.mark.parametrize("technique", list(TECHNIQUES))
@pytest.mark.parametrize("compensator", COMPENSATOR_NAMES)
def test_replay_of_the_executed_trace_gives_the_engine_parameters(technique: str, compensator: str) -> None:
    units, items = tiny_units(num_units=4), stream(36)
    plan = make_plan(3, 2, num_units=4, **TECHNIQUES[technique])  # type: ignore[arg-type]
    engine, result = run_plan(plan, items, units=units, arrival=1.5, lr=LR, compensator=compensator,
                              compensator_settings=SETTINGS)
    assert result.trace is not None and result.updates_per_stage[0] > 0
    expected = replay(units, plan, items, list(result.trace), compensator)
    got = [list(v.params) for v in engine.pipeline.store.masters()]
    assert_close(got, expected, rtol=0.0, atol=0.0)


def test_replay_detects_a_trace_that_lies_about_a_version() -> None:
    units, items = tiny_units(num_units=4), stream(24)
    plan = make_plan(3, 2, num_units=4)
    engine, result = run_plan(plan, items, units=units, arrival=1.5, lr=LR)
    assert result.trace is not None
    trace = list(result.trace)
    index = next(i for i, e in enumerate(trace) if e.kind is Kind.B and e.version_read > 0)
    e = trace[index]
    trace[index] = TraceEvent(e.kind, e.worker, e.stage, e.item, e.version_read - 1, None, e.start, e.end)
    expected = replay(units, plan, items, trace, "none")
    got = [list(v.params) for v in engine.pipeline.store.masters()]
    with pytest.raises(AssertionError):
        assert_close(got, expected, rtol=0.0, atol=0.0)
