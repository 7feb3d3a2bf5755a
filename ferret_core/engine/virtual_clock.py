"""The virtual clock: a deterministic discrete-event simulation of the schedule (DESIGN §2).

Item i arrives at i·t^d. An action takes its stage's profiled time: F takes Σt̂^f over the stage's
units, B takes Σt̂^b (plus Σt̂^f when the worker recomputes, the R part first); U takes no time (folded
into B). Prediction at arrival costs no time. A step of b items (a mini-batch, or an item with replayed
items; :class:`~ferret_core.engine.steps.StepShape`) takes the profile's times for batch b
(:meth:`ferret_core.profile.ModelProfile.layer_times`), its F runs ``forward_passes`` forwards, and the
stage-0 F first runs the step's whole-model ``overhead`` passes. The real computation of an action runs when its
completion event is processed, with the versions current at that moment; this equals running it at
its start, because only the executor's own U changes the replica it reads and the master is only
needed at the U, which happens at the B's end.

Events at equal times are processed completions first (in the order the actions started), then the
arrival, so a trainer that finishes exactly when an item arrives is free for it. Given a profile and a
seed the run is deterministic on any machine.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor

from ferret_core.engine.actions import Action, Kind
from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.state import FixedStamps
from ferret_core.engine.steps import UNIT_STEP, StepShape
from ferret_core.errors import ConfigError
from ferret_core.plan import Partition
from ferret_core.profile import ModelProfile


class Sample(Protocol):
    """One arrival: a sample without batch dimension and its label (``None``: no label)."""

    @property
    def x(self) -> Tensor: ...

    @property
    def y(self) -> int | None: ...


PerBatch = Callable[[int], tuple[tuple[float, ...], tuple[float, ...]]]


@dataclass(frozen=True)
class StageTimes:
    """Σt̂^f and Σt̂^b of each stage, in the profile's time unit, for one item; ``per_batch(b)`` gives
    them for a step of b items (``None``: only single items are known)."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    per_batch: PerBatch | None = field(default=None, compare=False, repr=False)
    _cache: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    @classmethod
    def from_profile(cls, profile: ModelProfile, partition: Partition) -> StageTimes:
        if profile.num_units != partition.num_units:
            raise ConfigError(
                f"profile of {profile.model!r} has {profile.num_units} units, the partition covers "
                f"{partition.num_units}; use the profile of the model being run"
            )

        def per_batch(batch: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
            times = profile.layer_times(batch)
            return (
                tuple(sum(times[u][0] for u in stage) for stage in partition.stages),
                tuple(sum(times[u][1] for u in stage) for stage in partition.stages),
            )

        return cls(
            tuple(sum(profile.layers[u].t_f for u in stage) for stage in partition.stages),
            tuple(sum(profile.layers[u].t_b for u in stage) for stage in partition.stages),
            per_batch,
        )

    @classmethod
    def instant(cls, num_stages: int) -> StageTimes:
        """Every action takes no time (Oracle: each item is trained before the next arrives)."""
        zeros = (0.0,) * num_stages
        return cls(zeros, zeros, lambda batch: (zeros, zeros))

    def at_batch(self, batch: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(Σt̂^f, Σt̂^b) per stage of a step of ``batch`` items."""
        if batch == 1:
            return self.forward, self.backward
        times = self._cache.get(batch)
        if times is None:
            if self.per_batch is None:
                raise ConfigError(
                    f"stage times for a step of {batch} items are unknown: build StageTimes.from_profile with a "
                    "profile that has batch_times (`ferret profile --batch-sizes ...`)"
                )
            times = self._cache[batch] = self.per_batch(batch)
        return times

    def duration(self, action: Action, recompute: bool, shape: StepShape = UNIT_STEP) -> tuple[float, float]:
        """(R part, whole duration) of ``action`` for a step of ``shape``; the R part is 0 without
        recomputation."""
        forward, backward = self.at_batch(shape.batch)
        j = action.stage
        if action.kind is Kind.F:
            extra = self.overhead(shape) if j == 0 else 0.0
            return 0.0, extra + shape.forward_passes * forward[j]
        r = forward[j] if recompute else 0.0
        return r, r + backward[j]

    def overhead(self, shape: StepShape) -> float:
        """Time of the step's whole-model overhead passes."""
        total = 0.0
        for batch, with_backward in shape.overhead:
            forward, backward = self.at_batch(batch)
            total += sum(forward) + (sum(backward) if with_backward else 0.0)
        return total


class VirtualClock:
    """Drives a :class:`Pipeline` through a stream on simulated time."""

    def __init__(self, pipeline: Pipeline, times: StageTimes, arrival_interval: float) -> None:
        if len(times.forward) != pipeline.num_stages:
            raise ConfigError(f"stage times for {len(times.forward)} stages, the plan has {pipeline.num_stages}")
        if not arrival_interval >= 0:
            raise ConfigError(f"arrival interval must be >= 0, got {arrival_interval}")
        self.pipeline = pipeline
        self.times = times
        self.arrival_interval = arrival_interval
        self.now = 0.0
        self._heap: list[tuple[float, int, int, _Arrival | _Done]] = []
        self._seq = itertools.count()

    def run(self, items: Iterable[Sample], on_arrival: Callable[[int], None] | None = None) -> None:
        """Feed every item of ``items`` and run until every admitted item has finished."""
        stream = iter(items)
        index = 0
        first = next(stream, None)
        if first is not None:
            self._push(0.0, _Arrival(0, first))
        p = self.pipeline
        while self._heap:
            t, _, _, event = heapq.heappop(self._heap)
            self.now = t
            if isinstance(event, _Arrival):
                index, x, y = event.index, event.sample.x, event.sample.y
                prediction = p.predict(x)
                if p.dispatch(index, x, y, prediction) is None:
                    self._poke(index % p.plan.num_workers, 0)
                self._pull()
                if on_arrival is not None:
                    on_arrival(index)
                following = next(stream, None)
                if following is not None:
                    self._push((index + 1) * self.arrival_interval, _Arrival(index + 1, following))
            else:
                p.execute(event.action, event.stamps)
                for worker, stage in p.scheduler.finish(event.action):
                    self._poke(worker, stage)
                self._pull()
        p.finish_stream()

    def _pull(self) -> None:
        for worker in self.pipeline.pull():  # buffering methods start a mini-batch when the trainer is free
            self._poke(worker, 0)

    def _poke(self, worker: int, stage: int) -> None:
        p = self.pipeline
        action = p.scheduler.next_action(worker, stage)
        if action is None:
            return
        p.scheduler.start(action)
        split, duration = p.scheduler.duration(
            action, self.times, p.plan.workers[worker].recompute, p.step_shape(action.item)
        )
        t = self.now
        self._push(t + duration, _Done(action, FixedStamps(t, t + split, t + duration)))

    def _push(self, t: float, event: _Arrival | _Done) -> None:
        # completions (0) before arrivals (1) at equal times, then in the order they were pushed
        heapq.heappush(self._heap, (t, int(isinstance(event, _Arrival)), next(self._seq), event))


@dataclass(frozen=True, slots=True)
class _Arrival:
    index: int
    sample: Sample


@dataclass(frozen=True, slots=True)
class _Done:
    action: Action
    stamps: FixedStamps
