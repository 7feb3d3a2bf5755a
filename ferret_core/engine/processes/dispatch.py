"""The coordinator's schedule state for process executors: what each executor is sent next, and what its
reports change.

:class:`Dispatch` owns the :class:`~ferret_core.schedule.scheduler.Scheduler`, the admission rule, the
counters, the trace and the items' stage-0 inputs and labels until they are sent. It does no I/O: the
clock (:class:`~ferret_core.engine.processes.clock.ProcessClock`) sends the messages it returns and hands
it the executors' reports. Every method is called under the clock's lock.

Messages to an executor: ``("F", item, lowest, x, target, in_shape)`` (stage 0 gets the sample ``x``, the
last stage the label), ``("FB", …, out_shape)`` at the last stage, where an item's B is always the next
action after its F (1F1B: a ready B goes first), and ``("B", item, out_shape)``; each ends with
``received``, what the executor's neighbours have taken of its sends (:meth:`Dispatch.received`). Reports replay through
the scheduler in the order the executor ran them; another order is a :class:`ScheduleError`.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ferret_core.engine.admission import ServiceTimes
from ferret_core.engine.state import Counters
from ferret_core.errors import ScheduleError
from ferret_core.metrics import OnlineAccuracy
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Action, Kind, SkipReason, TraceEvent
from ferret_core.schedule.scheduler import Scheduler, ScheduleRules

Executor = tuple[int, int]  # (worker, stage)
Message = tuple[Any, ...]


class Dispatch:
    """Scheduler, admission, counters and trace of one process clock (see the module docstring)."""

    def __init__(self, plan: Plan, rules: ScheduleRules, *, keep_trace: bool, queue_slots: int | None = None) -> None:
        self.plan = plan
        self.queue_slots = queue_slots  # waiting items per worker (None: the rules' wait_slots)
        self.rules = rules
        self.scheduler = Scheduler(rules)
        self.counters = Counters(plan.num_workers, plan.num_stages)
        self.online = OnlineAccuracy()
        self.trace: list[TraceEvent] | None = [] if keep_trace else None
        self.origin = 0.0  # trace times are seconds since this perf_counter value
        self.inputs: dict[int, Tensor] = {}  # stage 0's input of admitted items not yet sent
        self.targets: dict[int, int] = {}  # the label, until the last stage's F is sent
        self.shapes: list[tuple[int, ...]] = []  # per stage, its input for one item (batch 1); then the output
        self._non_finite: set[int] = set()  # in-flight items with a dropped gradient (counted once)
        # per worker, busy seconds per item at its slowest stage, from the executors' own action times (the
        # messages between actions are not in them): what the live planner compares with the profile
        self.service_times = ServiceTimes(plan.num_workers, plan.num_stages, 0.0)

    def replan(self, plan: Plan, rules: ScheduleRules) -> None:
        """A drained pipeline takes ``plan``: a fresh scheduler; counters (T3's item counts) carry over."""
        if not self.scheduler.idle():
            raise ScheduleError("a re-plan needs a drained pipeline: drain() first")
        self.plan = plan
        self.rules = rules
        self.scheduler = Scheduler(rules)
        self.service_times = ServiceTimes(plan.num_workers, plan.num_stages, 0.0)

    def measured_service_times(self) -> tuple[float | None, ...]:
        """Per worker, its measured busy seconds per item at its slowest stage (None until measured)."""
        return tuple(self.service_times.measured(n) for n in range(self.plan.num_workers))

    # ------------------------------------------------------------------------------------ arrivals
    def admit(self, index: int, x: Tensor, y: int | None, prediction: int) -> tuple[SkipReason | None, int | None]:
        """Count item ``index``'s prediction and admit it to worker i mod N (the wall clock's rule,
        :meth:`Pipeline._admit`), or say why not: (skip reason, worker)."""
        c = self.counters
        c.items += 1
        if y is not None:
            self.online.update(prediction, y)
        reason, worker = self._admit(index, x, y)
        if reason is not None:
            c.skipped[reason.value] += 1
        return reason, worker

    def _admit(self, index: int, x: Tensor, y: int | None) -> tuple[SkipReason | None, int | None]:
        if y is None:
            return SkipReason.NO_LABEL, None
        n = index % self.plan.num_workers
        if not self.plan.workers[n].live:
            return SkipReason.WORKER_REMOVED, None
        m = self.counters.admitted[n]
        lowest = self.rules.lowest_backprop_stage(n, m)
        if lowest is None:
            self.counters.admitted[n] += 1
            return SkipReason.OMITTED, None
        if not self.scheduler.can_admit(n, self.queue_slots):
            return SkipReason.BUSY, None
        self.counters.admitted[n] += 1
        self.inputs[index] = x
        self.targets[index] = y
        self.scheduler.admit(n, index, lowest)
        return None, n

    # ------------------------------------------------------------------------------------- actions
    def next_message(self, worker: int, stage: int) -> Message | None:
        """Start executor (worker, stage)'s next action in the scheduler and return the message that runs
        it, or ``None`` when it has none."""
        action = self.scheduler.next_action(worker, stage)
        if action is None:
            return None
        last = self.plan.num_stages - 1
        if stage == last and action.kind is not Kind.F:
            raise ScheduleError(f"{action}: the last stage runs an item's B with its F, never alone")
        self.scheduler.start(action)
        item = action.item
        received = self.received(worker, stage)
        if action.kind is not Kind.F:
            return ("B", item, self.shapes[stage + 1], received)
        x = self.inputs.pop(item).detach().cpu().numpy() if stage == 0 else None
        target = self.targets.pop(item) if stage == last else None
        lowest = self.scheduler.lowest(item)
        if stage == last:
            return ("FB", item, lowest, x, target, self.shapes[stage], self.shapes[stage + 1], received)
        return ("F", item, lowest, x, target, self.shapes[stage], received)

    def received(self, worker: int, stage: int) -> tuple[int, int]:
        """What executor (worker, stage)'s neighbours have taken of its sends so far: the F's its next stage
        finished (each read one of its forward sends, in order) and the B's its previous stage finished (each
        read one of its input gradients, in order); 0 where there is no such stage. The executor lets go of
        the payloads they read (:meth:`~ferret_core.engine.processes.executor._Executor.acknowledge`)."""
        c, last = self.counters, self.plan.num_stages - 1
        return (
            c.forwards[worker][stage + 1] if stage < last else 0,
            c.backwards[worker][stage - 1] if stage > 0 else 0,
        )

    def forward_done(self, n: int, j: int, report: Message, *, then_backward: bool) -> list[Executor]:
        """Replay an F executor (n, j) ran; at the last stage start the B it ran next. Returns the executors
        whose next action may have changed."""
        _, item, read, t0, t1 = report
        self.counters.forwards[n][j] += 1
        self.service_times.record(n, j, t1 - t0, forward=True)
        self._record(Kind.F, n, j, item, read, None, t0, t1)
        changed = [e for e in self.scheduler.finish(Action(Kind.F, n, j, item)) if e != (n, j) or not then_backward]
        if then_backward:
            backward = self.scheduler.next_action(n, j)
            if backward != Action(Kind.B, n, j, item):
                raise ScheduleError(f"executor {n}/{j} ran item {item}'s B, the scheduler's next action is {backward}")
            self.scheduler.start(backward)
        return changed

    def backward_done(self, n: int, j: int, report: Message) -> list[Executor]:
        """Replay a B (with its R and U) executor (n, j) ran; returns the executors whose next action may
        have changed."""
        _, item, read, t0, t_recompute, t1, update, non_finite = report
        c = self.counters
        lowest = self.scheduler.lowest(item)
        b_start = t0
        if t_recompute is not None:
            c.recomputes[n][j] += 1
            self._record(Kind.R, n, j, item, read, None, t0, t_recompute)
            b_start = t_recompute
        c.backwards[n][j] += 1
        self._record(Kind.B, n, j, item, read, None, b_start, t1)
        busy = t1 - t0
        if update is not None:
            master_read, written, tu0, tu1, stalenesses = update
            busy += tu1 - tu0
            c.updates[n][j] += 1
            c.add_staleness(j, stalenesses)
            self._record(Kind.U, n, j, item, master_read, written, tu0, tu1)
        self.service_times.record(n, j, busy, forward=False)
        if non_finite and item not in self._non_finite:
            self._non_finite.add(item)
            c.skipped[SkipReason.NON_FINITE.value] += 1
        if j == lowest:  # the item's last action
            if item in self._non_finite:
                self._non_finite.discard(item)
            else:
                c.trained_any_stage += 1
                c.trained += int(lowest == 0)
        return list(self.scheduler.finish(Action(Kind.B, n, j, item)))

    def _record(
        self, kind: Kind, n: int, j: int, item: int, read: int, written: int | None, t0: float, t1: float
    ) -> None:
        if self.trace is not None:
            self.trace.append(TraceEvent(kind, n, j, item, read, written, t0 - self.origin, t1 - self.origin))
