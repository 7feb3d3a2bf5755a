"""The state a pipeline keeps besides versions: action time stamps, in-flight items and counters."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from ferret_core.engine.result import EngineStats
from ferret_core.engine.stage_exec import StageGraph
from ferret_core.engine.steps import Held, LossFn
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ScheduleError
from ferret_core.schedule.actions import SkipReason
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape


class Stamps(Protocol):
    """Times of one action's trace events: its start, the R/B boundary (T1), and its end."""

    def start(self) -> float: ...

    def split(self) -> float: ...

    def end(self) -> float: ...


@dataclass(frozen=True, slots=True)
class FixedStamps:
    """Times decided in advance (the virtual clock)."""

    t_start: float
    t_split: float
    t_end: float

    def start(self) -> float:
        return self.t_start

    def split(self) -> float:
        return self.t_split

    def end(self) -> float:
        return self.t_end


@dataclass(eq=False)
class InFlightItem:
    """An admitted item in flight (one :class:`~ferret_core.engine.steps.TrainingStep`: a single stream item,
    a mini-batch, or either with replayed items). Lists are indexed by stage (slot writes are atomic
    across threads)."""

    index: int
    worker: int
    lowest: int
    target: Tensor
    inputs: list[Tensor | None]  # stage input waiting for F, or kept for R (T1)
    stashes: list[StageVersion | None]  # version read at F, for stages it is back-propagated at
    graphs: list[StageGraph | None]  # forward graph kept for B (no T1)
    grad_outputs: list[Tensor | None]  # gradient of the stage's output, from stage j+1
    loss: LossFn | None = None  # the last stage's loss (None: cross-entropy against ``target``)
    samples: int = 1  # stream items it trains
    shape: StepShape = UNIT_STEP  # its cost on the virtual clock
    held: tuple[Held | None, ...] = ()  # where buffers keep the step's rows (evicted if it is non-finite)
    bad_rows: Tensor | None = None  # rows whose output was non-finite at the last stage's B (the blame)

    def tensors(self) -> Iterator[Tensor]:
        yield self.target
        for x in self.inputs:
            if x is not None:
                yield x
        for g in self.graphs:
            if g is not None:
                yield g.input
                yield g.output
        for t in self.grad_outputs:
            if t is not None:
                yield t


@dataclass(eq=False)
class GradientBuffer:
    """Worker n's accumulated gradient of one stage (T2: one buffer, not one gradient per item) and the
    versions its gradients read (for the staleness counted when it is applied)."""

    grads: list[Tensor] | None = None
    reads: list[int] = field(default_factory=list)
    # the sum's 2-norm while the buffer holds one gradient whose norm the caller measured (the non-finite
    # check's step_guard.finite_norm), else None: the norm guard reads it instead of taking it again
    norm: float | None = None

    def add(self, grads: Sequence[Tensor], read: int, norm: float | None = None) -> int:
        """Add one (compensated) gradient the caller owns, with its 2-norm where measured; returns how many
        the buffer now holds."""
        if self.grads is None:
            self.grads = list(grads)  # the first gradient becomes the buffer: no copy
            self.norm = norm
        else:
            torch._foreach_add_(self.grads, list(grads))
            self.norm = None
        self.reads.append(read)
        return len(self.reads)

    @property
    def count(self) -> int:
        """How many gradients the buffer holds."""
        return len(self.reads)

    def take(self) -> tuple[list[Tensor], list[int]]:
        """The sum and the read versions; the buffer is empty afterwards (read :attr:`norm` before)."""
        if self.grads is None:
            raise ScheduleError(
                "an update needs at least one accumulated gradient, got an empty buffer; take() only after "
                "add() (check count first)"
            )
        grads, reads = self.grads, self.reads
        self.grads, self.reads, self.norm = None, [], None
        return grads, reads

    def tensors(self) -> list[Tensor]:
        return [] if self.grads is None else list(self.grads)


@dataclass
class Counters:
    """Everything counted per worker n and stage j, plus the stream totals. ``admitted[n]``: items
    worker n took, i.e. its item counter m (T3's alignment), omitted items included."""

    num_workers: int
    num_stages: int
    forwards: list[list[int]] = field(init=False)
    backwards: list[list[int]] = field(init=False)
    recomputes: list[list[int]] = field(init=False)
    updates: list[list[int]] = field(init=False)
    admitted: list[int] = field(init=False)
    items: int = 0
    trained: int = 0
    trained_any_stage: int = 0
    skipped: dict[str, int] = field(default_factory=lambda: {r.value: 0 for r in SkipReason})
    in_place_updates: int = 0
    staleness_sum: list[int] = field(init=False)
    staleness_count: list[int] = field(init=False)
    staleness_max: list[int] = field(init=False)
    staleness_histogram: list[dict[int, int]] = field(init=False)  # per stage: τ → applied gradients

    def __post_init__(self) -> None:
        n, p = self.num_workers, self.num_stages
        self.forwards = [[0] * p for _ in range(n)]
        self.backwards = [[0] * p for _ in range(n)]
        self.recomputes = [[0] * p for _ in range(n)]
        self.updates = [[0] * p for _ in range(n)]
        self.admitted = [0] * n
        self.staleness_sum = [0] * p
        self.staleness_count = [0] * p
        self.staleness_max = [0] * p
        self.staleness_histogram = [{} for _ in range(p)]

    def add_staleness(self, stage: int, stalenesses: Sequence[int]) -> None:
        """Count the staleness of the gradients one update of ``stage`` applied (under the caller's lock)."""
        self.staleness_sum[stage] += sum(stalenesses)
        self.staleness_count[stage] += len(stalenesses)
        self.staleness_max[stage] = max(self.staleness_max[stage], *stalenesses)
        hist = self.staleness_histogram[stage]
        for tau in stalenesses:
            hist[tau] = hist.get(tau, 0) + 1

    def updates_per_stage(self) -> tuple[int, ...]:
        return tuple(sum(row[j] for row in self.updates) for j in range(self.num_stages))

    def mean_staleness(self) -> tuple[float, ...]:
        """Per stage, the mean staleness of the applied gradients (0 where none was applied)."""
        return tuple(s / k if k else 0.0 for s, k in zip(self.staleness_sum, self.staleness_count, strict=True))

    def engine_stats(
        self,
        *,
        in_flight: int,
        peak_bytes: int | None,
        staleness_bound: tuple[int, ...],
        compensations_truncated: tuple[int, ...] = (),
    ) -> EngineStats:
        """These counters as a running engine reports them (:meth:`StreamEngine.stats`, the process clock's)."""
        updates = self.updates_per_stage()
        return EngineStats(
            items=self.items,
            trained=self.trained,
            trained_any_stage=self.trained_any_stage,
            skipped=dict(self.skipped),
            updates=sum(updates),
            updates_per_stage=updates,
            in_flight=in_flight,
            peak_bytes=peak_bytes,
            mean_staleness=self.mean_staleness(),
            max_staleness=tuple(self.staleness_max),
            staleness_bound=staleness_bound,
            compensations_truncated=compensations_truncated,
        )
