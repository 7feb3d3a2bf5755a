"""A stage's compensator state read and written where its shared memory lives.

On executor processes a stage's compensators keep no state of their own worth saving: what the thread
engine's one compensator per stage holds is shared per stage, in the shared memory of the host that owns
the stage (Alg. 1's delta ring, :mod:`.deltas`; Gap-Aware's C and n, :mod:`.average`; λ and the EMAs or
DC-ASGD-a's mean square, :mod:`.tuning`). A **view** is a compensator built like the stage's executors
build theirs and pointed at that memory, so its ``state_dict()``/``load_state_dict()`` are the thread
engine's format. The coordinator builds views of its own stages (:class:`~.clock.ProcessClock`), a host's
agent of the stages it owns (:mod:`.host_agent`), both through this module, so a snapshot or a re-plan's
new clock keeps every stage's λ wherever the stage runs.

Both read and write under the stage's update lock (the executors update that state inside it), waiting at
most ``timeout`` for it: an executor killed during its update never releases it (:class:`ScheduleError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ferret_core.compensation import CompensatorSettings, StageCompensator, make_compensator
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.tuning import SharedTuning
from ferret_core.errors import ScheduleError


@dataclass(frozen=True)
class CompensatorSpec:
    """How a stage's executors build their compensator: its name, settings and ring capacity."""

    compensator: str
    settings: CompensatorSettings
    ring_capacity: int


def stage_view(
    spec: CompensatorSpec,
    params: Sequence[Tensor],
    *,
    deltas: SharedDeltas | None,
    average: SharedStepAverage | None,
    tuning: SharedTuning | None,
    ring: bool = True,
) -> StageCompensator:
    """A compensator of the stage over the state its executors share: what the thread engine's one
    compensator per stage would hold; without ``ring``, over a ring of its own (empty) instead of the
    stage's shared one (loading keeps the shared ring: its deltas are of this clock's versions)."""
    view = make_compensator(spec.compensator, params, spec.settings, spec.ring_capacity)
    if deltas is not None and ring:
        view.share_ring(deltas.ring())
    if average is not None:
        view.share_average(average.tensors(), average.count)
    if tuning is not None:
        view.share_tuning_state(tuning.tensors())
    return view


def read_state(view: StageCompensator, lock: Any, stage: int, timeout: float) -> dict[str, Any]:
    """``view.state_dict()`` under the stage's update ``lock``, waiting at most ``timeout`` seconds."""
    _acquire(lock, stage, timeout, "read")
    try:
        return view.state_dict()
    finally:
        lock.release()


def load_state(view: StageCompensator, lock: Any, stage: int, state: Mapping[str, Any], timeout: float) -> None:
    """Write ``state`` into ``view`` (built without its ring: the shared ring keeps what it holds) under the
    stage's update ``lock``, waiting at most ``timeout`` seconds for it."""
    _acquire(lock, stage, timeout, "written")
    try:
        view.load_state_dict({**state, "ring": view.state_dict()["ring"]} if "ring" in state else state)
    finally:
        lock.release()


def _acquire(lock: Any, stage: int, timeout: float, what: str) -> None:
    if not lock.acquire(timeout=timeout):
        raise ScheduleError(
            f"stage {stage}'s update lock was not free within {timeout:g} s (an executor killed during its "
            f"update holds it): its compensator state cannot be {what}"
        )
