"""Shared helpers of the engine tests (tiny MLP units, hand-made plans, streams), and their self-checks.

The engine tests import from here; the module is named ``test_engine_*`` so that it lives beside them.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ferret_core.engine import EngineSettings, FerretPolicy, SimulationResult, StageTimes, StreamEngine
from ferret_core.plan import Partition, Plan, WorkerConfig

torch.set_num_threads(1)

IN_FEATURES = 6
CLASSES = 4


@dataclass(frozen=True)
class Item:
    x: torch.Tensor
    y: int | None


def tiny_units(seed: int = 0, num_units: int = 3, width: int = 8) -> list[nn.Module]:
    """``num_units`` small units: Linear+GroupNorm+ReLU blocks, then a Linear head."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng():
        torch.manual_seed(int(torch.randint(0, 2**31 - 1, (), generator=gen)))
        units: list[nn.Module] = []
        fan_in = IN_FEATURES
        for _ in range(num_units - 1):
            units.append(nn.Sequential(nn.Linear(fan_in, width), nn.GroupNorm(2, width), nn.ReLU()))
            fan_in = width
        units.append(nn.Sequential(nn.Linear(fan_in, CLASSES)))
    return units


def stream(n: int, seed: int = 0) -> list[Item]:
    gen = torch.Generator().manual_seed(seed + 1000)
    return [
        Item(torch.randn(IN_FEATURES, generator=gen), int(torch.randint(0, CLASSES, (), generator=gen)))
        for _ in range(n)
    ]


def make_plan(
    stages: int = 3,
    workers: int = 2,
    *,
    num_units: int | None = None,
    recompute: bool | Sequence[bool] = False,
    accumulation: int | Sequence[Sequence[int]] = 1,
    omission: int | Sequence[Sequence[int]] = 0,
    live: Sequence[bool] | None = None,
) -> Plan:
    """A hand-made plan: ``stages`` equal stages over ``num_units`` (default one unit per stage).

    Scalars apply to every worker (omission to stages 0..P−2; the last stage is always back-propagated).
    """
    units = num_units or stages
    bounds = tuple(round(j * units / stages) for j in range(stages + 1))
    configs = []
    for n in range(workers):
        rec = recompute if isinstance(recompute, bool) else recompute[n]
        acc = (accumulation,) * stages if isinstance(accumulation, int) else tuple(accumulation[n])
        om = (omission,) * (stages - 1) + (0,) if isinstance(omission, int) else tuple(omission[n])
        configs.append(WorkerConfig(n, live=True if live is None else live[n], recompute=rec,
                                    accumulation=acc, omission=om))
    return Plan(
        model="tiny", partition=Partition(bounds), workers=tuple(configs), arrival_interval=1.0, decay=0.1,
        stage_forward_time=1.0, stage_backward_time=2.0, adaptation_rate=0.0, planned_bytes=12345,
        paper_memory_elements=0, min_feasible_bytes=0, budget_bytes=None, memory_model="paper",
        dtype="float32",
    )


def uniform_times(stages: int, forward: float = 1.0, backward: float = 2.0) -> StageTimes:
    return StageTimes((forward,) * stages, (backward,) * stages)


def run_plan(
    plan: Plan,
    items: Sequence[Item],
    *,
    units: Sequence[nn.Module] | None = None,
    arrival: float = 1.0,
    times: StageTimes | None = None,
    **settings: object,
) -> tuple[StreamEngine, SimulationResult]:
    units = units if units is not None else tiny_units(num_units=plan.partition.num_units)
    setup = FerretPolicy(plan).setup("tiny", len(units), arrival)
    engine = StreamEngine(units, setup, EngineSettings(**settings))  # type: ignore[arg-type]
    result = engine.run_virtual(items, times or uniform_times(plan.num_stages), arrival)
    return engine, result


def sequential_model(units: Sequence[nn.Module]) -> nn.Sequential:
    return nn.Sequential(*copy.deepcopy(list(units)))


def test_make_plan_shapes() -> None:
    plan = make_plan(3, 2, num_units=6, omission=1)
    assert plan.partition.boundaries == (0, 2, 4, 6)
    assert plan.workers[1].omission == (1, 1, 0)


def test_stream_is_seeded() -> None:
    a, b = stream(5, seed=3), stream(5, seed=3)
    assert all(torch.equal(p.x, q.x) and p.y == q.y for p, q in zip(a, b, strict=True))
