"""The one schedule logic: which action each (worker, stage) executor runs next (paper §"Architectural
design": asynchronous 1F1B pipelines; DESIGN §2: both clocks ask this class, nothing else decides).

Rules, per worker n (its items never touch another worker's executors):

* **Admission.** An admitted item waits in worker n's stage-0 queue until executor (n, 0) takes its
  forward. A worker holds at most ``wait_slots`` items waiting there: an arrival is admitted iff, counting
  it, no more than ``wait_slots`` items would be waiting after executor (n, 0) starts whatever it can start
  now. Otherwise it is skipped as ``busy`` (Ferret: ``wait_slots = 1``; 1-Skip: ``0``, i.e. trained only if
  the trainer is free at its arrival).
* **Dependencies.** F at stage j needs the item's F at j−1; the last stage's B needs its F there; B at
  j < P−1 needs B at j+1. T3: an item is back-propagated at the stages [k, P−1] its rules give
  (``lowest_backprop_stage``); B at k is its last action.
* **1F1B.** An idle executor with a ready B runs the B first, else the oldest ready F (FIFO).
* **In-flight cap** (PipeDream's 1F1B warm-up): executor (n, j) starts an F only while fewer than
  ``in_flight_cap(n, j)`` (Ferret: P − j) items are in flight there: items whose F at j started and
  whose work at j is not over — their B at j for items back-propagated at j, else the item's last B
  (at its lowest back-propagated stage k > j: T3 omits the backward at j, not the item's passage).
  This keeps eq. ferret-svre's P − j items per stage; when the pipeline backs up, the cap propagates
  back to admission as ``busy`` skips.

The class is pure bookkeeping (no torch, no clock, no threads); the wall clock serialises calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.stage_times import StageTimes
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape


class ScheduleRules(Protocol):
    """The decisions a policy makes over the shared 1F1B machinery."""

    @property
    def num_workers(self) -> int: ...

    @property
    def num_stages(self) -> int: ...

    @property
    def wait_slots(self) -> int: ...

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int | None:
        """k such that the worker's m-th item is back-propagated at stages k..P−1; ``None``: at none."""
        ...

    def in_flight_cap(self, worker: int, stage: int) -> int: ...


class PlanRules:
    """Ferret's rules from a :class:`~ferret_core.plan.Plan`: T3's LCM alignment (DESIGN §3.6),
    PipeDream's 1F1B cap P − j, ``wait_slots`` waiting items per worker."""

    def __init__(self, plan: Plan, *, wait_slots: int = 1) -> None:
        if wait_slots < 0:
            raise ConfigError(f"wait_slots must be >= 0, got {wait_slots}")
        self.plan = plan
        self._wait_slots = wait_slots

    @property
    def num_workers(self) -> int:
        return self.plan.num_workers

    @property
    def num_stages(self) -> int:
        return self.plan.num_stages

    @property
    def wait_slots(self) -> int:
        return self._wait_slots

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int | None:
        config = self.plan.workers[worker]
        for stage in range(self.plan.num_stages):
            if config.backpropagates(item_in_worker, stage):
                return stage
        return None

    def in_flight_cap(self, worker: int, stage: int) -> int:
        return self.plan.num_stages - stage


def not_next(action: Action, queue: Iterable[int]) -> ScheduleError:
    """The error for starting ``action`` when it is not its executor's next ready action."""
    return ScheduleError(
        f"{action} is not the next ready action of executor {action.worker}/{action.stage} (its ready "
        f"{action.kind.value} queue holds items {list(queue)[:3]}); start only what next_action returns"
    )


def not_running(action: Action, running: Action | None) -> ScheduleError:
    """The error for finishing ``action`` when its executor is not running it."""
    return ScheduleError(
        f"executor {action.worker}/{action.stage} is not running {action} (running {running}); finish only "
        "the action it started"
    )


@dataclass
class _Executor:
    ready_f: deque[int] = field(default_factory=deque)
    ready_b: deque[int] = field(default_factory=deque)
    running: Action | None = None
    in_flight: int = 0


class Scheduler:
    """Per-executor queues and the 1F1B choice (see the module docstring)."""

    def __init__(self, rules: ScheduleRules) -> None:
        self.rules = rules
        self.num_workers = rules.num_workers
        self.num_stages = rules.num_stages
        self._ex = [[_Executor() for _ in range(self.num_stages)] for _ in range(self.num_workers)]
        self._lowest: dict[int, int] = {}

    # ------------------------------------------------------------------------------------ admission
    def waiting(self, worker: int) -> int:
        """Items admitted to ``worker`` that wait for its first stage."""
        return len(self._ex[worker][0].ready_f)

    def can_admit(self, worker: int, slots: int | None = None) -> bool:
        """Whether worker ``worker`` can take a new item now (see the module docstring), with ``slots``
        waiting items instead of the rules' ``wait_slots`` when given (the wall clock's admission queue)."""
        ex = self._ex[worker][0]
        waiting = len(ex.ready_f)
        starts_now = (
            waiting == 0
            and ex.running is None
            and not ex.ready_b
            and ex.in_flight < self.rules.in_flight_cap(worker, 0)
        )
        return waiting + (0 if starts_now else 1) <= (self.rules.wait_slots if slots is None else slots)

    def admit(self, worker: int, item: int, lowest: int) -> None:
        if not 0 <= lowest < self.num_stages:
            raise ConfigError(
                f"item {item}: lowest back-propagated stage {lowest} is not a stage (expected 0 <= k < "
                f"{self.num_stages}); the rules' lowest_backprop_stage must return a stage or None"
            )
        self._lowest[item] = lowest
        self._ex[worker][0].ready_f.append(item)

    def lowest(self, item: int) -> int:
        return self._lowest[item]

    def in_flight_items(self) -> int:
        """Admitted items that have not finished their last action."""
        return len(self._lowest)

    # ------------------------------------------------------------------------------------ execution
    def next_action(self, worker: int, stage: int) -> Action | None:
        """The action executor (worker, stage) should start now, or ``None`` (busy or nothing ready)."""
        ex = self._ex[worker][stage]
        if ex.running is not None:
            return None
        if ex.ready_b:
            return Action(Kind.B, worker, stage, ex.ready_b[0])
        if ex.ready_f and ex.in_flight < self.rules.in_flight_cap(worker, stage):
            return Action(Kind.F, worker, stage, ex.ready_f[0])
        return None

    def start(self, action: Action) -> None:
        ex = self._ex[action.worker][action.stage]
        if ex.running is not None:
            raise ScheduleError(
                f"{action}: executor {action.worker}/{action.stage} is already running {ex.running}; start an "
                "action only when next_action offers it (finish the running one first)"
            )
        queue = ex.ready_b if action.kind is Kind.B else ex.ready_f
        if not queue or queue[0] != action.item:
            raise not_next(action, queue)
        queue.popleft()
        ex.running = action
        if action.kind is Kind.F:
            ex.in_flight += 1

    def finish(self, action: Action) -> tuple[tuple[int, int], ...]:
        """Record that ``action`` completed; returns the executors whose next action may have changed."""
        n, j, item = action.worker, action.stage, action.item
        ex = self._ex[n][j]
        if ex.running != action:
            raise not_running(action, ex.running)
        ex.running = None
        last = self.num_stages - 1
        if action.kind is Kind.F:
            if j < last:
                self._ex[n][j + 1].ready_f.append(item)
                return ((n, j), (n, j + 1))
            ex.ready_b.append(item)
            return ((n, j),)
        ex.in_flight -= 1
        lowest = self._lowest[item]
        if j > lowest:
            self._ex[n][j - 1].ready_b.append(item)
            return ((n, j), (n, j - 1))
        del self._lowest[item]
        for below in range(lowest):  # stages the item passed without a backward (T3)
            self._ex[n][below].in_flight -= 1
        return ((n, j), *((n, below) for below in range(lowest)))

    def duration(
        self, action: Action, times: StageTimes, recompute: bool, shape: StepShape = UNIT_STEP
    ) -> tuple[float, float]:
        """(R part, whole duration) of ``action`` on the virtual clock, for a step of ``shape`` (schedules
        that split the backward pass charge their own parts, :mod:`ferret_core.engine.schedules`)."""
        return times.duration(action, recompute, shape)

    # ------------------------------------------------------------------------------------ queries
    def idle(self) -> bool:
        """No action running or ready anywhere (every admitted item has finished)."""
        return not self._lowest and all(
            ex.running is None and not ex.ready_f and not ex.ready_b for row in self._ex for ex in row
        )

    def in_flight(self, worker: int, stage: int) -> int:
        return self._ex[worker][stage].in_flight
