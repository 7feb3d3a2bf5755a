"""The engine's frozen vocabulary: what an executor does (:class:`Action`), what it did
(:class:`TraceEvent`) and why an arriving item was not trained (:class:`SkipReason`).

An *executor* is one (worker n, stage j) pair. The scheduler hands executors two kinds of actions,
``F`` (forward of an item at a stage) and ``B`` (backward of an item at a stage). A ``B`` is executed
as up to three trace events: ``R`` (the recompute forward, T1, only when the worker recomputes), ``B``
itself, and ``U`` (the update of the master stage, when the accumulation count reaches c^a_{n,j}, T2).
``U`` takes no time of its own on the virtual clock (it is folded into ``B``, DESIGN §2).

Schedules that split the backward pass (zero bubble, Qi et al. 2023) run ``B`` as the *input*-gradient
pass only and a later ``W`` as the *weight*-gradient pass of the same (item, stage); the update then
follows the ``W`` (see :mod:`ferret_core.engine.schedules`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    """Kinds of trace events; ``F``, ``B`` and ``W`` are also the kinds of scheduled actions."""

    F = "F"
    B = "B"
    R = "R"
    U = "U"
    W = "W"


class SkipReason(StrEnum):
    """Why an arriving item (predicted all the same) was not trained.

    ``worker_removed``: its worker slot was removed (T4). ``no_label``: it came without a label.
    ``busy``: its worker could not admit it (see :mod:`ferret_core.schedule.scheduler`). ``omitted``: T3
    omits its backward pass at every stage (only possible when c^o_{n,P−1} > 0, which Alg. 2 never
    sets), so forwarding it would change nothing. ``non_finite``: it was admitted, but its loss or a
    gradient of it (as computed, or after compensation) holds NaN or ±inf, so its contribution was
    dropped before any update: it never reaches the weights (never an arrival's reason: it is decided
    during training and counted then, once per item). Buffering methods (B-Skip, Camel,
    :mod:`ferret_core.engine.buffering`): ``evicted``: pushed out of the newest-B window by newer
    arrivals before a mini-batch was drawn; ``not_selected``: in the window when a mini-batch was drawn,
    but not drawn; ``stream_end``: still in the window when the stream ended.
    """

    WORKER_REMOVED = "worker_removed"
    NO_LABEL = "no_label"
    BUSY = "busy"
    OMITTED = "omitted"
    NON_FINITE = "non_finite"
    EVICTED = "evicted"
    NOT_SELECTED = "not_selected"
    STREAM_END = "stream_end"


@dataclass(frozen=True, slots=True)
class Action:
    """A unit of work the scheduler hands to executor (``worker``, ``stage``): ``F`` or ``B`` of ``item``."""

    kind: Kind
    worker: int
    stage: int
    item: int

    def __str__(self) -> str:
        return f"{self.kind.value}{self.item}"


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One executed step.

    ``version_read``: the stage version the step computed with (F, R, B: the replica version current at
    the item's forward, i.e. its stash; U: the master version the update was applied to).
    ``version_written``: the master version a ``U`` created (``None`` for the other kinds).
    ``start``/``end``: virtual time units of the profile, or seconds since the start of a wall-clock run.
    """

    kind: Kind
    worker: int
    stage: int
    item: int
    version_read: int
    version_written: int | None
    start: float
    end: float

    @property
    def executor(self) -> tuple[int, int]:
        return (self.worker, self.stage)

    def __str__(self) -> str:
        return f"{self.kind.value}{self.item}"
