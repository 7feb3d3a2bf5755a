"""Admission by event time on the wall clock (DESIGN §4 "Admission"; ``docs/service.md`` "Admission").

On the virtual clock item i arrives at i·t^d and its worker admits it iff at most ``wait_slots`` items
would wait for the first stage (:mod:`ferret_core.schedule.scheduler`). On the wall clock items reach the
trainer when Kafka delivers them, and a delivery carries every record produced since the last one: read
by *poll time* such a batch is a burst, and every item after the first finds its worker busy. Read by
*event time* (when the producer stamped each item) it is the stream it was. So the wall clock judges
an arrival by its event time:

**Rule.** Worker n keeps ``ready_n``, the event time at which it would be free to start another item
had every item it admitted arrived at its event time and taken ``service_n`` seconds (its measured busy
time per item at its bottleneck stage, :class:`ServiceTimes`). An item with event time e is admitted iff
it would wait at most W there:

    wait = max(0, ready_n − e) ≤ W;   if admitted: ready_n ← max(ready_n, e) + service_n

``ready_n`` is read in event-time order, not in the order items are delivered: a consumer hands over one
partition's records, then another's stamped earlier, and an item waits only for the admitted items stamped
before it (:class:`EventTimeAdmission`).

**W** (:func:`max_wait`) = ln 2 / c: the time the item's data value e^{−c·t} (the decay of eq.
ferret-svre's R_F) takes to halve, so no item waits longer than it takes to lose half its value
(infinite when c = 0). 1-Skip's W is 0: trained only if its worker is free at its arrival.

**W on the wall clock.** c is given in the profile's time (DESIGN §3.9: by default the data value
halves over one sequential forward and backward of the whole model *by the profile*, Σ(t̂^f + t̂^b)).
The live trainer does not run at the profile's speed (MNISTNet: the profile's 1.09 ms per item against a
measured 5–14 ms in the trainer), so ln 2 / c read as wall seconds is not the same wait: it made W
1.1 ms against a 14-ms service time and skipped every item that arrived while the worker trained
(``benchmarks/live/README.md``). The wall clock reads W in the machine's time instead: with s_n worker
n's measured service time and t̂_n its service time by the profile (its stage's t̂^f + t̂^b),

    W_n = (ln 2 / c) · s_n / t̂_n

(:meth:`AdmissionSettings.wait_for`); with the default c that is one measured whole-model step of a
1 × 1 plan. Until s_n is measured, s_n = t̂_n and W_n = ln 2 / c. The virtual clock is unchanged (its
time is the profile's).

**The queue.** Admitted items wait for the first stage in a bounded FIFO queue per worker that holds
their inputs only. Its size (:func:`queue_slots`) is what reaches a worker while one item may wait W plus
what one delivery may carry late, and at least one delivery's share of the worker:
K = max(⌈(W + D) / (N·t^d)⌉, ⌈B / N⌉) (D: the consumer's delivery spread, the longest time between an
item's event time and its delivery that is not backlog; B: the most records one delivery hands over).
The B term is what lets a worker that keeps up catch up after a pause (start-up, a re-plan's drain, a
snapshot): the backlog arrives in deliveries of up to B items whose event times say the worker was free,
and the consumer hands them over faster than one worker trains them. The queue holds K inputs per
live worker (:func:`queue_bytes`, :mod:`ferret_core.planning.admission_queue`), and the planner counts them in the
plan's bytes when its memory settings carry the queue (the trainer's do). A full queue
makes an item ``busy`` whatever the rule says (it guards memory when the measured service time lags a slowdown).

Everything here is bookkeeping on numbers: the wall clock calls it under its lock.
"""

from __future__ import annotations

import bisect
import collections
import math
import statistics
from dataclasses import dataclass

from ferret_core.errors import ConfigError
from ferret_core.planning.admission_queue import MAX_QUEUE_SLOTS, max_wait, queue_bytes, queue_slots

__all__ = [
    "MAX_QUEUE_SLOTS",
    "AdmissionSettings",
    "EventTimeAdmission",
    "ServiceTimes",
    "max_wait",
    "queue_bytes",
    "queue_slots",
]

# Admitted items remembered per worker to place a late-delivered item by its event time (halved when full).
RETAINED_ITEMS = 1024


@dataclass(frozen=True)
class AdmissionSettings:
    """How the wall clock admits arrivals that carry an event time: the longest wait W (seconds of the
    profile), the queue's size K (waiting items per worker), the service time assumed until one is
    measured (the wall clock takes the larger of it and the plan's t^f + t^b), and ``profile_service_s``,
    a worker's service time by the profile (its stage's t^f + t^b): when > 0, W is read in the machine's
    time (:meth:`wait_for`, "W on the wall clock" in the module docstring)."""

    max_wait_s: float
    queue_slots: int
    initial_service_s: float = 0.0
    profile_service_s: float = 0.0
    start_horizon_s: float = math.inf  # H: items waiting for real at most ⌊(W + H) / s⌋ (:meth:`start_slots`)

    def __post_init__(self) -> None:
        if (
            math.isnan(self.max_wait_s)
            or self.max_wait_s < 0
            or self.queue_slots < 1
            or not self.initial_service_s >= 0
            or not (math.isfinite(self.profile_service_s) and self.profile_service_s >= 0)
            or not self.start_horizon_s >= 0
        ):
            raise ConfigError(
                f"need max_wait_s >= 0, queue_slots >= 1, initial_service_s >= 0 and a finite "
                f"profile_service_s >= 0, got {self.max_wait_s}, {self.queue_slots}, {self.initial_service_s}, "
                f"{self.profile_service_s}"
            )

    def start_slots(self, wait_s: float, service_s: float) -> int | None:
        """The real queue's bound: how many admitted items may wait for the worker's first stage so that
        each starts within ``wait_s`` (W in the machine's time) + H of now at ``service_s`` per item,
        ⌊(W + H) / s⌋, at least 1; ``None`` (no bound) when W + H is infinite or s unknown. The event-time
        rule's timeline alone gets no feedback from the real queue: a service time that under-states what
        an item costs lets it admit more than the worker trains, and the queue, up to K, grows behind the
        predictions."""
        span = wait_s + self.start_horizon_s
        if not math.isfinite(span) or service_s <= 0:
            return None
        return max(1, math.floor(span / service_s + 1e-9))

    def wait_for(self, service_s: float) -> float:
        """W for a worker measured at ``service_s`` seconds per item: ``max_wait_s`` (ln 2 / c, in the
        profile's seconds) × ``service_s`` / ``profile_service_s``, the same wait in the machine's seconds;
        ``max_wait_s`` itself when ``profile_service_s`` is 0 or W is 0 or infinite."""
        if self.profile_service_s <= 0 or self.max_wait_s == 0 or math.isinf(self.max_wait_s):
            return self.max_wait_s
        return self.max_wait_s * max(0.0, service_s) / self.profile_service_s


class _Timeline:
    """One worker's admitted items in event-time order, with when each would finish under the rule's
    model (items arriving at their event times, served first come first served): finish_k =
    max(finish_{k−1}, e_k) + service_k. ``base``: the finish of the items already folded away."""

    __slots__ = ("base", "events", "finishes", "services")

    def __init__(self) -> None:
        self.events: list[float] = []
        self.services: list[float] = []
        self.finishes: list[float] = []
        self.base = -math.inf

    def free_at(self, event_time: float) -> tuple[int, float]:
        """Where an item stamped ``event_time`` goes (after those stamped at or before it) and when the
        worker would be free for it there."""
        place = bisect.bisect_right(self.events, event_time)
        return place, self.finishes[place - 1] if place else self.base

    def insert(self, place: int, event_time: float, service: float, free: float) -> None:
        self.events.insert(place, event_time)
        self.services.insert(place, service)
        self.finishes.insert(place, 0.0)
        for k in range(place, len(self.events)):  # the items stamped after it now finish later
            free = max(free, self.events[k]) + self.services[k]
            self.finishes[k] = free
        if len(self.events) > RETAINED_ITEMS:
            cut = len(self.events) - RETAINED_ITEMS // 2
            self.base = self.finishes[cut - 1]
            del self.events[:cut], self.services[:cut], self.finishes[:cut]


class EventTimeAdmission:
    """The rule of the module docstring for ``num_workers`` workers and a maximum wait ``max_wait_s``.

    ``ready_n`` is read in event-time order, whatever order the items are delivered in: Kafka delivers
    each partition's records in order but the partitions in turns, so an item may reach the trainer
    after items stamped later than it (on another partition). Such an item is placed among the admitted
    items by its event time; it waits for the items stamped before it only (the ones stamped after it
    now finish ``service`` later). The last :data:`RETAINED_ITEMS` admitted items per worker are kept;
    an item stamped before all of them is judged as if it came after them (it is that late)."""

    def __init__(self, num_workers: int, max_wait_s: float) -> None:
        if num_workers < 1 or max_wait_s < 0 or math.isnan(max_wait_s):
            raise ConfigError(f"need num_workers >= 1 and max_wait_s >= 0, got {num_workers} and {max_wait_s}")
        self.max_wait_s = max_wait_s
        self._timelines = [_Timeline() for _ in range(num_workers)]

    def admit(self, worker: int, event_time: float, service_time: float, max_wait_s: float | None = None) -> bool:
        """Whether ``worker`` takes an item stamped ``event_time`` (seconds, any origin shared by the
        stream's items) when each item keeps it ``service_time`` seconds; reserves its turn if so.
        ``max_wait_s``: this call's W (:meth:`AdmissionSettings.wait_for`; default the rule's own)."""
        timeline = self._timelines[worker]
        place, free = timeline.free_at(event_time)
        if free - event_time > (self.max_wait_s if max_wait_s is None else max_wait_s):
            return False
        timeline.insert(place, event_time, max(0.0, service_time), free)
        return True

    def wait(self, worker: int, event_time: float) -> float:
        """How long an item stamped ``event_time`` would wait for ``worker`` now (0 when it is free)."""
        return max(0.0, self._timelines[worker].free_at(event_time)[1] - event_time)


class ServiceTimes:
    """Per worker, the measured busy seconds per item at its bottleneck stage: the service time of the
    admission rule.

    Every action's cost is added to its (worker, stage): its wall time, counted by the wall clock from the
    end of the executor's previous action when it went straight on to this one (so the bookkeeping, lock
    and GIL waits between a busy worker's actions count); every ``window`` forwards at a stage (one
    per item passing it), the busy seconds since the last fold divided by those forwards is one sample.
    A stage's estimate is the median of its last ``samples`` samples, counting ``initial`` in place of
    those not taken yet: one slow window (a fresh pipeline's first backward passes, a pause of the
    machine) does not move it, a lasting change does within ⌈samples/2⌉ windows. (An EWMA is moved by one
    slow window: on benchmarks/live's 0.25× MNISTNet run the first window measured 124 ms per item against
    a steady 5 ms, and an EWMA stayed above the 13.9 ms arrival interval for a second, skipping 58 items
    ``busy`` while the worker was idle.) A worker's service time is the largest over its measured stages
    (a pipeline takes items no faster than its slowest stage), ``initial`` until a stage has folded once.
    """

    def __init__(self, num_workers: int, num_stages: int, initial: float, *, window: int = 4, samples: int = 5) -> None:
        if num_workers < 1 or num_stages < 1 or initial < 0 or window < 1 or samples < 1:
            raise ConfigError(
                f"need workers, stages, window, samples >= 1 and initial >= 0, got {num_workers}, "
                f"{num_stages}, {window}, {samples}, {initial}"
            )
        self.initial = initial
        self.window = window
        self._busy = [[0.0] * num_stages for _ in range(num_workers)]
        self._forwards = [[0] * num_stages for _ in range(num_workers)]
        self._samples = [
            [collections.deque([initial] * samples, maxlen=samples) for _ in range(num_stages)]
            for _ in range(num_workers)
        ]
        self._folded = [[False] * num_stages for _ in range(num_workers)]
        # per worker, service_time()'s answer, recomputed when a window folds (the admission rule reads it
        # per arrival: a median per call costs the record path's thread)
        self._service = [initial] * num_workers

    def record(self, worker: int, stage: int, seconds: float, *, forward: bool) -> None:
        """One action of (``worker``, ``stage``) took ``seconds``; ``forward``: it was an item's F there."""
        self._busy[worker][stage] += seconds
        if not forward:
            return
        self._forwards[worker][stage] += 1
        count = self._forwards[worker][stage]
        if count < self.window:
            return
        self._samples[worker][stage].append(self._busy[worker][stage] / count)
        self._folded[worker][stage] = True
        self._busy[worker][stage] = 0.0
        self._forwards[worker][stage] = 0
        self._service[worker] = self._estimate(worker)

    def measured(self, worker: int) -> float | None:
        """:meth:`service_time` once one of the worker's stages has folded a window, else None."""
        return self.service_time(worker) if any(self._folded[worker]) else None

    def service_time(self, worker: int) -> float:
        """Busy seconds per item at the worker's slowest stage (``initial`` before any measurement)."""
        return self._service[worker]

    def _estimate(self, worker: int) -> float:
        measured = [
            statistics.median(samples)
            for samples, folded in zip(self._samples[worker], self._folded[worker], strict=True)
            if folded
        ]
        return max(measured) if measured else self.initial
