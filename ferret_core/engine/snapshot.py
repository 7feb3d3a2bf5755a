"""An engine's learned state as plain tensors and numbers, and back into a new engine.

:func:`engine_state` takes, from a drained engine (no item in flight), copies of the master weights keyed
by the model's units (``"<unit index>.<name inside the unit>"``, independent of the partition, so a
state moves between plans), the optimizer's state, each stage's compensator state and the online-accuracy
counters. :func:`load_unit_weights` writes the weights into a model's units (build the new engine from
them), :func:`restore_engine_state` the rest into that engine. Replicas and stashes are not state: a
restored engine starts with every worker's replica at the master (what a re-plan does too).

This is the round trip the generic check suite runs over every method (River's ``check_estimator``
checks that an estimator's state survives pickling); the trainer's Redis snapshots carry the same parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ferret_core.engine.engine import StreamEngine
from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.metrics import OnlineAccuracy


@dataclass(frozen=True)
class EngineState:
    """What an engine has learned (copies; see the module docstring)."""

    weights: Mapping[str, Tensor]
    optimizer: Mapping[str, Any]
    compensators: tuple[Mapping[str, Any], ...]
    online: Mapping[str, Any]


def engine_state(engine: StreamEngine) -> EngineState:
    """The learned state of a drained ``engine``."""
    p = engine.pipeline
    if p.in_flight():
        raise ScheduleError(
            f"the engine's state is taken with no item in flight, got {p.in_flight()}: drain the engine "
            "(finish its items) before taking its state"
        )
    weights: dict[str, Tensor] = {}
    stages = engine.setup.plan.partition.stages
    for units, tensors in zip(stages, p.master_state(), strict=True):
        for key, value in tensors.items():
            local, _, name = key.partition(".")
            weights[f"{units[int(local)]}.{name}"] = value
    return EngineState(
        weights=weights,
        optimizer=p.optimizer.state_dict(),
        compensators=tuple(c.state_dict() for c in p.compensators),
        online=p.online.to_dict(),
    )


def load_unit_weights(units: Sequence[nn.Module], state: EngineState) -> None:
    """Copy ``state``'s weights into ``units`` (every parameter and buffer must be covered)."""
    expected = {f"{u}.{name}" for u, unit in enumerate(units) for name, _ in _tensors(unit)}
    if expected != set(state.weights):
        missing, extra = sorted(expected - set(state.weights)), sorted(set(state.weights) - expected)
        raise ConfigError(f"the state does not fit these units: missing {missing[:5]}, unexpected {extra[:5]}")
    with torch.no_grad():
        for u, unit in enumerate(units):
            for name, tensor in _tensors(unit):
                tensor.copy_(state.weights[f"{u}.{name}"])


def restore_engine_state(engine: StreamEngine, state: EngineState) -> None:
    """Load the optimizer, compensator and online-accuracy state into ``engine`` (built from units that
    :func:`load_unit_weights` filled)."""
    p = engine.pipeline
    if len(state.compensators) != len(p.compensators):
        raise ConfigError(
            f"the state has {len(state.compensators)} compensator(s), the engine {len(p.compensators)} stages; "
            "restore into an engine with the same partition"
        )
    p.optimizer.load_state_dict(dict(state.optimizer))
    for compensator, saved in zip(p.compensators, state.compensators, strict=True):
        compensator.load_state_dict(saved)
    p.online = OnlineAccuracy.from_dict(state.online)


def states_equal(a: EngineState, b: EngineState) -> bool:
    """Whether two states hold the same values (tensors compared exactly)."""
    return (
        a.weights.keys() == b.weights.keys()
        and all(torch.equal(a.weights[k], b.weights[k]) for k in a.weights)
        and _equal(a.optimizer, b.optimizer)
        and len(a.compensators) == len(b.compensators)
        and all(_equal(x, y) for x, y in zip(a.compensators, b.compensators, strict=True))
        and _equal(a.online, b.online)
    )


def _tensors(unit: nn.Module) -> list[tuple[str, Tensor]]:
    return [*unit.named_parameters(), *unit.named_buffers()]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and torch.equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
