"""The synchronous schedules' scheduler: 1F1B with a flush every m micro-batches (DAPPLE), optionally with
the backward split into B and W (zero bubble) and executors that share a device (Hanayo's waves).

Rules, over R pipeline rows ("workers" of the engine) of P stages:

* **Flush groups.** Admission fills group g: each pipeline (a *slot*: one row, or Hanayo's 2W rows on
  one set of devices) takes m micro-batches (``flush_every``), so a group holds S·m items for S slots,
  all of which read the same weights at every stage. When every item of a closed group has produced
  its gradient at stage j, stage j is updated once with their sum (the *flush* of stage j, run by
  :class:`~ferret_core.engine.schedules.flush_pipeline.FlushPipeline`). A slot whose share of the open
  group is complete admits nothing (arrivals for its rows are ``busy``) until stage 0 has flushed,
  which opens group g+1; an F of group g+1 at stage j also waits for stage j's
  flush of group g (with a split backward, stage j > 0 may flush after stage 0). A group that never
  closes — the stream ended — is never flushed: its gradients are not applied, as in the engine.
* **Admission** otherwise as the engine's (``wait_slots`` items may wait for stage 0 per row).
* **Priorities** per device: a ready B first (1F1B), then the oldest startable F, then the oldest W
  (zero bubble: weight gradients fill what would be bubbles); ties by item number. An executor starts
  an F only while fewer than P − j items are in flight there (DAPPLE's warm-up of P − j forwards;
  items stay in flight until their last backward action at j: B, or W when split).
* **Split backward** (``split_backward``): the backward at stage j of an item is B (input gradient)
  then W (weight gradient), except at the item's lowest stage, which needs no input gradient and runs
  W alone. On the virtual clock B takes ``input_share``·t̂^b, W the rest; a lone W takes t̂^b (plus
  the recompute, T1, before the first backward action).
* **Devices**: executors mapped to one device run one action at a time (Hanayo); by default every
  executor is its own device.

Pure bookkeeping, like :class:`~ferret_core.schedule.scheduler.Scheduler` (whose interface it keeps).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.scheduler import Scheduler, not_next, not_running
from ferret_core.schedule.stage_times import StageTimes
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape

Executor = tuple[int, int]  # (row, stage)
Device = tuple[int, int]


@dataclass(frozen=True)
class FlushRules:
    """A synchronous schedule's shape (implements :class:`~ferret_core.schedule.scheduler.ScheduleRules`)."""

    num_workers: int  # R pipeline rows
    num_stages: int  # P
    flush_every: int  # m micro-batches per slot and group
    rows_per_slot: int = 1  # rows sharing one pipeline's quota (Hanayo: 2W); row n is slot n mod S's
    wait_slots: int = 1
    split_backward: bool = False
    input_share: float = 0.5  # of t̂^b charged to B when split
    devices: Mapping[Executor, Device] = field(default_factory=dict)  # empty: one device per executor

    def __post_init__(self) -> None:
        if self.num_workers < 1 or self.num_stages < 1:
            raise ConfigError(f"a schedule needs >= 1 row and stage, got {self.num_workers} and {self.num_stages}")
        if self.rows_per_slot < 1 or self.num_workers % self.rows_per_slot:
            raise ConfigError(f"{self.num_workers} rows do not split into slots of {self.rows_per_slot}")
        if self.flush_every < 1:
            raise ConfigError(f"flush_every (m) must be >= 1 micro-batch, got {self.flush_every}")
        if self.wait_slots < 0:
            raise ConfigError(f"wait_slots must be >= 0, got {self.wait_slots}")
        if not (math.isfinite(self.input_share) and 0.0 < self.input_share < 1.0):
            raise ConfigError(f"input_share (B's part of t̂^b) must lie in (0, 1), got {self.input_share}")

    def lowest_backprop_stage(self, worker: int, item_in_worker: int) -> int:
        return 0  # synchronous schedules back-propagate every item through every stage

    def in_flight_cap(self, worker: int, stage: int) -> int:
        return self.num_stages - stage

    def device(self, worker: int, stage: int) -> Device:
        return self.devices.get((worker, stage), (worker, stage))

    @property
    def num_slots(self) -> int:
        return self.num_workers // self.rows_per_slot

    def slot(self, worker: int) -> int:
        """Row n belongs to slot n mod S (so item i, on row i mod R, goes to slot i mod S as in DAPPLE)."""
        return worker % self.num_slots

    @property
    def group_size(self) -> int:
        return self.num_slots * self.flush_every


@dataclass
class _ExecutorState:
    ready_f: deque[int] = field(default_factory=deque)
    ready_b: deque[int] = field(default_factory=deque)
    ready_w: deque[int] = field(default_factory=deque)
    running: Action | None = None
    in_flight: int = 0


@dataclass
class _Group:
    admitted: list[int]  # per slot
    done: list[int]  # gradients produced per stage
    closed: bool = False


class FlushScheduler(Scheduler):
    """Flush groups, B/W split and shared devices over per-executor queues (see the module docstring)."""

    def __init__(self, rules: FlushRules) -> None:
        super().__init__(rules)
        self.flush_rules = rules
        r, p = rules.num_workers, rules.num_stages
        self._states = [[_ExecutorState() for _ in range(p)] for _ in range(r)]
        self._device_of = {(n, j): rules.device(n, j) for n in range(r) for j in range(p)}
        self._members: dict[Device, list[Executor]] = defaultdict(list)
        for executor, device in self._device_of.items():
            self._members[device].append(executor)
        self._busy: dict[Device, Action | None] = dict.fromkeys(self._members)
        self._group_of: dict[int, int] = {}
        self._backward_left: dict[int, int] = {}
        self._groups: dict[int, _Group] = {0: self._new_group()}
        self.open_group = 0
        self.flushes = [0] * p  # flushes done per stage = the version every F there reads
        self._lifted: set[int] = set()  # stages flushed since the last finish()

    def _new_group(self) -> _Group:
        return _Group([0] * self.flush_rules.num_slots, [0] * self.num_stages)

    # ------------------------------------------------------------------------------------ admission
    def waiting(self, worker: int) -> int:
        return len(self._states[worker][0].ready_f)

    def can_admit(self, worker: int, slots: int | None = None) -> bool:
        group = self._groups[self.open_group]
        if group.admitted[self.flush_rules.slot(worker)] >= self.flush_rules.flush_every:
            return False
        waiting = self.waiting(worker)
        starts_now = waiting == 0 and self._would_start_new_forward(worker)
        return waiting + (0 if starts_now else 1) <= (self.rules.wait_slots if slots is None else slots)

    def _would_start_new_forward(self, worker: int) -> bool:
        """Whether a new item's F at (worker, 0) would start right now: its device is idle, no B and no
        (older) startable F waits there, and the in-flight cap allows it (a ready W yields to an F)."""
        device = self._device_of[(worker, 0)]
        if self._busy[device] is not None:
            return False
        for n, j in self._members[device]:
            ex = self._states[n][j]
            if ex.ready_b or (ex.ready_f and self._may_forward(n, j, ex.ready_f[0])):
                return False
        return self._states[worker][0].in_flight < self.rules.in_flight_cap(worker, 0)

    def admit(self, worker: int, item: int, lowest: int) -> None:
        if not 0 <= lowest < self.num_stages:
            raise ConfigError(
                f"item {item}: lowest back-propagated stage {lowest} is not a stage (expected 0 <= k < "
                f"{self.num_stages}); the rules' lowest_backprop_stage must return a stage or None"
            )
        group = self._groups[self.open_group]
        slot = self.flush_rules.slot(worker)
        if group.admitted[slot] >= self.flush_rules.flush_every:
            raise ScheduleError(
                f"item {item}: slot {slot} already holds its {self.flush_rules.flush_every} items of group "
                f"{self.open_group}; admit only when can_admit says so"
            )
        group.admitted[slot] += 1
        group.closed = all(a == self.flush_rules.flush_every for a in group.admitted)
        self._group_of[item] = self.open_group
        self._lowest[item] = lowest
        self._backward_left[item] = self.num_stages - lowest  # stages whose B (fused) or W is still due
        self._states[worker][0].ready_f.append(item)

    def group_of(self, item: int) -> int:
        return self._group_of[item]

    # ------------------------------------------------------------------------------------ flushes
    def gradient_done(self, item: int, stage: int) -> bool:
        """Count the item's gradient of ``stage``; whether the stage's flush of its group is due now."""
        group = self._groups[self._group_of[item]]
        group.done[stage] += 1
        return group.closed and group.done[stage] == self.flush_rules.group_size

    def flushed(self, stage: int) -> None:
        """The pipeline flushed ``stage`` (its update is recorded): lift the barrier there; stage 0's
        flush opens the next group for admission."""
        self.flushes[stage] += 1
        self._lifted.add(stage)
        if stage == 0:
            self.open_group += 1
            self._groups[self.open_group] = self._new_group()
        for g in [g for g in self._groups if g < self.open_group and all(f > g for f in self.flushes)]:
            del self._groups[g]

    # ------------------------------------------------------------------------------------ execution
    def next_action(self, worker: int, stage: int) -> Action | None:
        device = self._device_of[(worker, stage)]
        if self._busy[device] is not None:
            return None
        best = self._best(device)
        if best is None or (best.worker, best.stage) != (worker, stage):
            return None
        return best

    def _best(self, device: Device) -> Action | None:
        """The action the device should run next: B, then a startable F, then W; oldest item first."""
        choice: tuple[int, int, Action] | None = None
        for n, j in self._members[device]:
            ex = self._states[n][j]
            if ex.running is not None:
                continue
            candidates = []
            if ex.ready_b:
                candidates.append((0, ex.ready_b[0], Action(Kind.B, n, j, ex.ready_b[0])))
            if ex.ready_f and self._may_forward(n, j, ex.ready_f[0]):
                candidates.append((1, ex.ready_f[0], Action(Kind.F, n, j, ex.ready_f[0])))
            if ex.ready_w:
                candidates.append((2, ex.ready_w[0], Action(Kind.W, n, j, ex.ready_w[0])))
            for candidate in candidates:
                if choice is None or candidate[:2] < choice[:2]:
                    choice = candidate
        return None if choice is None else choice[2]

    def _may_forward(self, worker: int, stage: int, item: int) -> bool:
        ex = self._states[worker][stage]
        return (
            ex.in_flight < self.rules.in_flight_cap(worker, stage)
            and self.flushes[stage] == self._group_of[item]
        )

    def start(self, action: Action) -> None:
        ex = self._states[action.worker][action.stage]
        device = self._device_of[(action.worker, action.stage)]
        if ex.running is not None or self._busy[device] is not None:
            raise ScheduleError(
                f"{action}: executor {action.worker}/{action.stage} or its device is busy (running "
                f"{ex.running}, device running {self._busy[device]}); start only what next_action returns"
            )
        queue = {Kind.F: ex.ready_f, Kind.B: ex.ready_b, Kind.W: ex.ready_w}[action.kind]
        if not queue or queue[0] != action.item:
            raise not_next(action, queue)
        queue.popleft()
        ex.running = action
        self._busy[device] = action
        if action.kind is Kind.F:
            ex.in_flight += 1

    def finish(self, action: Action) -> tuple[tuple[int, int], ...]:
        n, j, item = action.worker, action.stage, action.item
        ex = self._states[n][j]
        if ex.running != action:
            raise not_running(action, ex.running)
        ex.running = None
        self._busy[self._device_of[(n, j)]] = None
        changed: set[Executor] = {(n, j)}
        lowest = self._lowest[item]
        split = self.flush_rules.split_backward
        if action.kind is Kind.F:
            if j < self.num_stages - 1:
                self._states[n][j + 1].ready_f.append(item)
                changed.add((n, j + 1))
            else:
                self._queue_backward(n, j, item)
        elif action.kind is Kind.B and split:
            ex.ready_w.append(item)
            self._queue_backward(n, j - 1, item)
            changed.add((n, j - 1))
        else:  # a fused B, or a W: the item's work at this stage is over
            ex.in_flight -= 1
            if j > lowest and not split:
                self._queue_backward(n, j - 1, item)
                changed.add((n, j - 1))
            self._backward_left[item] -= 1
            if not self._backward_left[item]:  # its last gradient (a W may come after the lowest's)
                del self._lowest[item], self._group_of[item], self._backward_left[item]
                for below in range(lowest):
                    self._states[n][below].in_flight -= 1
                    changed.add((n, below))
        for stage in self._lifted:
            changed.update((row, stage) for row in range(self.num_workers))
        self._lifted.clear()
        return self._with_device_members(changed)

    def _queue_backward(self, worker: int, stage: int, item: int) -> None:
        """The item's first backward action at ``stage``: B, or W alone at its lowest stage when split."""
        ex = self._states[worker][stage]
        if self.flush_rules.split_backward and stage == self._lowest[item]:
            ex.ready_w.append(item)
        else:
            ex.ready_b.append(item)

    def _with_device_members(self, executors: set[Executor]) -> tuple[Executor, ...]:
        out: set[Executor] = set()
        for executor in executors:
            out.update(self._members[self._device_of[executor]])
        return tuple(sorted(out))

    def duration(
        self, action: Action, times: StageTimes, recompute: bool, shape: StepShape = UNIT_STEP
    ) -> tuple[float, float]:
        if not self.flush_rules.split_backward or action.kind is Kind.F:
            return times.duration(action, recompute, shape)
        forward, backward = times.at_batch(shape.batch)
        j = action.stage
        r = forward[j] if recompute else 0.0
        share = self.flush_rules.input_share
        if action.kind is Kind.B:
            return r, r + share * backward[j]
        if j == self._lowest[action.item]:  # a lone W: the whole backward, after the recompute
            return r, r + backward[j]
        return 0.0, (1.0 - share) * backward[j]

    # ------------------------------------------------------------------------------------ queries
    def idle(self) -> bool:
        return not self._lowest and all(
            s.running is None and not s.ready_f and not s.ready_b and not s.ready_w
            for row in self._states
            for s in row
        )

    def in_flight(self, worker: int, stage: int) -> int:
        return self._states[worker][stage].in_flight
