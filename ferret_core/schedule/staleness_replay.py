"""The staleness a plan's schedule reaches on the virtual clock, replayed without tensors.

DESIGN §3.13's bound (:func:`ferret_core.staleness.staleness_bound`) holds on any clock and for any
phase of the workers, so it over-counts what the virtual clock's deterministic schedule does (1 stage ×
5 workers of MNISTNet: bound 8, reached 4). This module replays the same events as
:class:`~ferret_core.engine.virtual_clock.VirtualClock` — arrivals every t^d, the one
:class:`~ferret_core.schedule.scheduler.Scheduler`, actions taking their stage times — and the
engine's version bookkeeping (DESIGN §3.13: an F reads worker n's replica of stage j, a B's gradient is
compensated against the master, every c^a-th B of (n, j) updates the master and refreshes the replica),
with no model, for single-item steps (Ferret's vanilla path).

Per stage it reports the largest staleness a gradient has when it is **compensated** (at its B: what the
Iter-Fisher ring must hold) and when it is **applied** (at the update: what the engine's counters and
``max_staleness`` report), and the histogram of the latter. The engine sizes its delta rings to the
former (it may still grow to the bound, see :meth:`StageCompensator.follow_staleness`), and
``tests/unit/test_staleness_replay.py`` checks the replay against executed runs.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.scheduler import PlanRules, Scheduler, ScheduleRules
from ferret_core.schedule.stage_times import StageTimes
from ferret_core.schedule.step_shape import UNIT_STEP


@dataclass(frozen=True)
class ReachedStaleness:
    """Per stage: the largest τ at compensation and at application, and τ → applied gradients."""

    compensated_max: tuple[int, ...]
    applied_max: tuple[int, ...]
    applied_histogram: tuple[dict[int, int], ...]


def replay_staleness(
    plan: Plan,
    times: StageTimes,
    arrival_interval: float,
    items: int,
    rules: ScheduleRules | None = None,
) -> ReachedStaleness:
    """Replay ``items`` arrivals of ``plan`` on the virtual clock (``rules``: the policy's, default
    Ferret's :class:`PlanRules` with one waiting slot) and report the staleness reached."""
    if items < 0:
        raise ConfigError(f"items must be >= 0, got {items}")
    if not arrival_interval >= 0:
        raise ConfigError(f"arrival interval must be >= 0, got {arrival_interval}")
    if len(times.forward) != plan.num_stages:
        raise ConfigError(f"stage times for {len(times.forward)} stages, the plan has {plan.num_stages}")
    rules = rules or PlanRules(plan)
    return _Replay(plan, rules, times).run(items, arrival_interval)


class _Replay:
    def __init__(self, plan: Plan, rules: ScheduleRules, times: StageTimes) -> None:
        self.plan, self.rules, self.times = plan, rules, times
        n, p = plan.num_workers, plan.num_stages
        self.scheduler = Scheduler(rules)
        self.master = [0] * p
        self.replica = [[0] * p for _ in range(n)]
        self.stash: dict[tuple[int, int], int] = {}  # (item, stage) → version its F read
        self.reads: list[list[list[int]]] = [[[] for _ in range(p)] for _ in range(n)]  # buffered gradients
        self.admitted = [0] * n
        self.lowest: dict[int, int] = {}
        self.compensated = [0] * p
        self.applied = [0] * p
        self.histogram: list[dict[int, int]] = [{} for _ in range(p)]
        self.heap: list[tuple[float, int, int, int | Action]] = []
        self.seq = itertools.count()
        self.now = 0.0

    def run(self, items: int, arrival_interval: float) -> ReachedStaleness:
        if items:
            self._push(0.0, 0)
        while self.heap:
            t, _, _, event = heapq.heappop(self.heap)
            self.now = t
            if isinstance(event, int):  # an arrival
                self._arrive(event)
                if event + 1 < items:
                    self._push((event + 1) * arrival_interval, event + 1)
            else:
                self._execute(event)
                for worker, stage in self.scheduler.finish(event):
                    self._poke(worker, stage)
        return ReachedStaleness(tuple(self.compensated), tuple(self.applied), tuple(self.histogram))

    def _arrive(self, index: int) -> None:
        """As :meth:`Pipeline._admit` for a labelled single item."""
        n = index % self.plan.num_workers
        if not self.plan.workers[n].live:
            return
        lowest = self.rules.lowest_backprop_stage(n, self.admitted[n])
        if lowest is None:
            self.admitted[n] += 1
            return
        if not self.scheduler.can_admit(n):
            return
        self.admitted[n] += 1
        self.lowest[index] = lowest
        self.scheduler.admit(n, index, lowest)
        self._poke(n, 0)

    def _execute(self, a: Action) -> None:
        n, j = a.worker, a.stage
        if a.kind is Kind.F:
            if j >= self.lowest[a.item]:
                self.stash[(a.item, j)] = self.replica[n][j]
            return
        read = self.stash.pop((a.item, j))
        self.compensated[j] = max(self.compensated[j], self.master[j] - read)
        buffered = self.reads[n][j]
        buffered.append(read)
        if len(buffered) >= self.plan.workers[n].accumulation[j]:  # the update: master and replica move
            for r in buffered:
                tau = self.master[j] - r
                self.applied[j] = max(self.applied[j], tau)
                self.histogram[j][tau] = self.histogram[j].get(tau, 0) + 1
            buffered.clear()
            self.master[j] += 1
            self.replica[n][j] = self.master[j]
        if j == self.lowest[a.item]:
            del self.lowest[a.item]

    def _poke(self, worker: int, stage: int) -> None:
        action = self.scheduler.next_action(worker, stage)
        if action is None:
            return
        self.scheduler.start(action)
        _, duration = self.scheduler.duration(action, self.times, self.plan.workers[worker].recompute, UNIT_STEP)
        self._push(self.now + duration, action)

    def _push(self, t: float, event: int | Action) -> None:
        # completions (0) before arrivals (1) at equal times, then in push order (as the virtual clock)
        heapq.heappush(self.heap, (t, int(isinstance(event, int)), next(self.seq), event))
