"""Compensator ablations on a fixed plan.

A plan depends on the compensator it was made for (its state is part of the bytes the planner counts),
so planning once per compensator compares different pipelines. :func:`run_compensators` fixes the plan
— make it with ``compensator="none"`` — and runs every compensator on it, for several seeds, on the
virtual clock with the profile's stage times: the runs differ in compensation only.

>>> runs = run_compensators(plan, profile, ["none", "iter-fisher"], [0, 1], make_run)  # doctest: +SKIP

``make_run(seed)`` builds the model's units, the stream and, optionally, a held-out split for that seed
(the same seed gives every compensator the same initial weights and items). ``ferret bench
compensation`` and ``benchmarks/engine/compensators.py`` call it; ``ferret simulate --plan FILE
--compensator NAME`` is the same run from the command line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from ferret_core.engine.engine import EngineSettings, StreamEngine
from ferret_core.engine.memory_meter import storage_bytes
from ferret_core.engine.policies import FerretPolicy
from ferret_core.engine.result import SimulationResult
from ferret_core.engine.virtual_clock import Sample
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.profile import ModelProfile
from ferret_core.schedule.stage_times import StageTimes

RunInputs = tuple[Sequence[nn.Module], Iterable[Sample], tuple[Tensor, Tensor] | None]


@dataclass(frozen=True)
class AblationRun:
    """One compensator on the fixed plan for one seed. ``state_bytes``: the distinct storages its
    per-stage state holds at the end of the run (measured, like the engine's memory)."""

    compensator: str
    seed: int
    result: SimulationResult
    state_bytes: int


def run_compensators(
    plan: Plan,
    profile: ModelProfile,
    compensators: Sequence[str],
    seeds: Sequence[int],
    make_run: Callable[[int], RunInputs],
    settings: EngineSettings | None = None,
) -> list[AblationRun]:
    """Run every compensator on ``plan`` for every seed (seed-major order); see the module docstring.
    ``settings`` (default :class:`EngineSettings`) is used with its ``compensator`` replaced."""
    if not compensators or not seeds:
        raise ConfigError("an ablation needs at least one compensator and one seed")
    base = settings or EngineSettings()
    times = StageTimes.from_profile(profile, plan.partition)
    runs = []
    for seed in seeds:
        for name in compensators:
            units, items, test = make_run(seed)
            setup = FerretPolicy(plan).setup(plan.model, len(units), plan.arrival_interval)
            engine = StreamEngine(units, setup, dataclasses.replace(base, compensator=name))
            result = engine.run_virtual(items, times, plan.arrival_interval, test=test)
            state = [t for c in engine.pipeline.compensators for t in c.state_tensors()]
            runs.append(AblationRun(name, seed, result, storage_bytes(state)))
    return runs
