"""What the trainer's parts share besides counters: the plan in force (with its version) and the
life-cycle state. Written on the loop thread, read from any thread (gRPC, metrics)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ferret_core.plan import Plan
from services.control.trainer_port import TrainerState


class PlanInForce:
    """The plan the learner executes and its version (1 at start-up; the control plane numbers the next).
    Swapped as one tuple, so a reader never sees a plan with another plan's version."""

    def __init__(self, plan: Plan, version: int = 1) -> None:
        self._current = (plan, version)

    def get(self) -> tuple[Plan, int]:
        return self._current

    def set(self, plan: Plan, version: int) -> None:
        self._current = (plan, version)

    @property
    def plan(self) -> Plan:
        return self._current[0]

    @property
    def version(self) -> int:
        return self._current[1]


class Lifecycle:
    """Where the trainer is (proto ``ServiceState``): STARTING → RUNNING → … → STOPPING."""

    def __init__(self) -> None:
        self.state = TrainerState.STARTING

    @contextmanager
    def during(self, state: TrainerState) -> Iterator[None]:
        """``state`` while the block runs (a re-plan, a snapshot, a restore), then the previous one."""
        previous = self.state
        self.state = state
        try:
            yield
        finally:
            self.state = previous
