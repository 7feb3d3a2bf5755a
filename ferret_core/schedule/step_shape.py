"""A training step's shape: how many items it trains and which extra passes it runs, i.e. what it costs
on the virtual clock and what the planner's byte and time models scale by (plain data, no torch)."""

from __future__ import annotations

from dataclasses import dataclass

from ferret_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class StepShape:
    """A step's cost on the virtual clock. Every stage forwards and back-propagates ``batch`` items;
    each F runs ``forward_passes`` forwards (2 when LwF's teacher forwards beside the student); before
    the stage-0 F the worker runs ``overhead``: whole-model passes ``(batch, with_backward)`` (MIR's
    virtual step and candidate scoring, MAS's importance pass)."""

    batch: int = 1
    forward_passes: int = 1
    overhead: tuple[tuple[int, bool], ...] = ()

    def __post_init__(self) -> None:
        if self.batch < 1 or self.forward_passes < 1 or any(b < 1 for b, _ in self.overhead):
            raise ConfigError(f"a step needs batch >= 1, forward_passes >= 1 and overhead batches >= 1, got {self}")


UNIT_STEP = StepShape()
