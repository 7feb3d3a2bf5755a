"""The virtual clock: a deterministic discrete-event simulation of the schedule (DESIGN §2).

Item i arrives at i·t^d. An action takes its stage's profiled time: F takes Σt̂^f over the stage's
units, B takes Σt̂^b (plus Σt̂^f when the worker recomputes, the R part first); U takes no time (folded
into B). Prediction at arrival costs no time. A step of b items (a mini-batch, or an item with replayed
items; :class:`~ferret_core.schedule.step_shape.StepShape`) takes the profile's times for batch b
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
from dataclasses import dataclass
from typing import Protocol

from torch import Tensor

from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.state import FixedStamps
from ferret_core.errors import ConfigError
from ferret_core.schedule.actions import Action
from ferret_core.schedule.stage_times import StageTimes


class Sample(Protocol):
    """One arrival: a sample without batch dimension and its label (``None``: no label)."""

    @property
    def x(self) -> Tensor: ...

    @property
    def y(self) -> int | None: ...


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
