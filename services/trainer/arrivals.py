"""The live planner's arrival interval (DESIGN §4): the stream's own rate, declared then measured, and
re-planning when it drifts beyond a ratio of the interval the plan was made for.

* **Declared**: ``ferret produce --rate R`` stamps every sample record with the stream's rate
  (:mod:`services.kafka.rate_headers`); a trainer that owns a of the topic's partitions expects R·a/partitions
  items/s. ``trainer.stream_rate`` in the config declares this trainer's own rate before any record
  arrives (the start-up plan, ``services.trainer.runner.startup_interval``).
* **Measured** (:class:`ArrivalRate`): from the producers' event times, not from when the trainer reads
  the records (Kafka delivers them in batches): every ``window`` items of a partition, its rate is
  (window − 1) / (newest − oldest event time); the stream's interval is 1 / Σ_p rate_p, folded into an
  EWMA.

The loop thread only records; a separate thread re-plans, through the control plane's re-planner, so
re-plans stay serialised and versioned like budget changes. A declared rate that differs from the plan's
re-plans at once; measured estimates re-plan at most once per cooldown.

**Measured service time** (``docs/planner.md`` reading 11; ours, not in the paper): the profile's times
are read in the machine's time. The wall clock measures each worker's busy seconds per item
(:meth:`~ferret_core.engine.wall_clock.WallClock.measured_service_times`); their ratio to the same
worker's time by the profile (:func:`measured_time_scale`) is the planner's ``time_scale``, and when it
leaves [k / ratio, k · ratio] of the scale the planner in force was made with (the same ratio as the
arrival drift), the trainer re-plans with the profile scaled by it (same cooldown) — unless the new plan
has the plan in force's partition and workers, which then runs on undrained (the planner is swapped for
later re-plans).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace

from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from services.kafka.rate_headers import Headers, declared_interval

log = logging.getLogger("ferret.trainer")


class ArrivalRate:
    """EWMA of the stream's inter-arrival interval (seconds) from event times (milliseconds).

    Kafka delivers records a partition batch at a time, so consecutive records the trainer reads are not
    consecutive in the stream. Each partition's rate is measured over windows of its own items, and the
    stream's interval is 1 / Σ_p rate_p (keys spread items over partitions; a partition without items
    adds nothing)."""

    def __init__(self, window: int = 50, alpha: float = 0.5) -> None:
        if window < 2 or not 0.0 <= alpha < 1.0:
            raise ConfigError(f"need window >= 2 and alpha in [0, 1), got {window} and {alpha}")
        self.window = window
        self.alpha = alpha
        self.partitions: frozenset[int] = frozenset()  # assigned to this trainer: an estimate waits for all
        self.estimate: float | None = None
        self._rates: dict[int, float] = {}  # items per second, per partition
        self._open: dict[int, tuple[int, int, int]] = {}  # partition -> (first, last, seen)

    def assign(self, partitions: Collection[int]) -> None:
        """The sample partitions now assigned to this trainer (from the consumer's assignment)."""
        self.partitions = frozenset(partitions)

    def observe(self, event_time_ms: int, partition: int = 0) -> float | None:
        """Record one arrival; returns a new estimate when a partition completes a window, else None."""
        first, last, seen = self._open.get(partition, (event_time_ms, event_time_ms, 0))
        first, last, seen = min(first, event_time_ms), max(last, event_time_ms), seen + 1
        if seen < self.window:
            self._open[partition] = (first, last, seen)
            return None
        del self._open[partition]
        self._rates[partition] = (self.window - 1) / (max(last - first, 1) / 1000.0)
        if any(p not in self._rates for p in (*self._open, *self.partitions)):
            return None  # an assigned or active partition has no rate yet: the sum would be too small
        interval = 1.0 / sum(self._rates.values())
        self.estimate = interval if self.estimate is None else self.alpha * self.estimate + (1 - self.alpha) * interval
        return self.estimate


def measured_time_scale(
    profile: ModelProfile, plan: Plan, measured: Sequence[float | None], compensation_time: float = 0.0
) -> float | None:
    """Measured ÷ profiled time per item: over the plan's live workers with a measured service time
    (busy seconds per item at the slowest stage), the largest ratio to the profile's time per item at the
    plan's bottleneck stage, t^f·(1 + c^r) + t^b (``profile`` as given, unscaled); None before any worker
    is measured. In a plan whose gradients can be stale the service time also holds their compensation,
    which the planner counts apart (``compensation_time``, reading 14): the largest stage's share of it is
    taken off first, so it is not counted twice."""
    geometry = StageGeometry.from_profile(profile, plan.partition)
    stale = plan.num_workers > 1 or plan.num_stages > 1
    extra = compensation_time * max(geometry.weights) / max(1, geometry.total_weights) if stale else 0.0
    ratios = [
        (s - extra) / (geometry.t_f * (1 + int(w.recompute)) + geometry.t_b)
        for w, s in zip(plan.workers, measured, strict=True)
        if w.live and s is not None and s - extra > 0
    ]
    return max(ratios) if ratios else None


class SwitchablePlanner:
    """What the control plane's re-planner calls: the planner for the arrival interval (and the staleness
    cost) in force. Swapping is one assignment; only the re-planner's worker thread calls :meth:`plan`.
    Two threads rebuild it (the arrival drift's, the live staleness calibration's), each changing its own
    settings: :meth:`rebuild` makes each rebuild keep the other's change."""

    def __init__(self, planner: Planner) -> None:
        self.current = planner
        self._rebuilding = threading.Lock()

    def rebuild(self, change: Callable[[PlannerSettings], PlannerSettings]) -> tuple[Planner, Planner]:
        """Replace the planner with one over ``change(settings in force)`` (its paths computed here, not on
        the re-planner's thread); returns (old, new)."""
        with self._rebuilding:
            old = self.current
            planner = Planner(old.base_profile, change(old.settings))
            planner.warm()
            self.current = planner
            return old, planner

    def plan(self, budget_bytes: int | None = None) -> Plan:
        return self.current.plan(budget_bytes)

    @property
    def min_feasible_bytes(self) -> int:
        return self.current.min_feasible_bytes


class DriftReplanner:
    """Re-plans when the measured interval leaves [t^d / ratio, t^d · ratio] of the plan's t^d.

    Built before the record path (which feeds :meth:`observe` and :meth:`assign`); :meth:`start` takes
    the control plane's re-plan request once the control plane exists. ``budget()`` is the budget in
    force, passed to the request as it is: None (unconstrained) stays None, so a rate re-plan never turns
    an unconstrained trainer into a budgeted one."""

    def __init__(
        self,
        planners: SwitchablePlanner,
        budget: Callable[[], int | None],
        *,
        ratio: float,
        cooldown_s: float = 10.0,
        rate: ArrivalRate | None = None,
        time_scale: Callable[[], float | None] | None = None,
        plan_in_force: Callable[[], Plan] | None = None,
    ) -> None:
        if ratio <= 1.0:
            raise ConfigError(f"arrival_drift_ratio must be > 1, got {ratio}")
        self.planners = planners
        self.rate = rate or ArrivalRate()
        self.request: Callable[[int | None], object] = _not_started
        self.budget = budget
        self.ratio = ratio
        self.cooldown_s = cooldown_s
        self.replans = 0
        self.declared: float | None = None  # the last declared interval seen (for this trainer's share)
        self.time_scale = time_scale  # measured ÷ profiled time per item now (None: not measured yet)
        self.scale_replans = 0
        self.plan_in_force = plan_in_force  # a scale re-plan that keeps its shape is not applied (no drain)
        self._estimates: queue.SimpleQueue[tuple[float, bool] | None] = queue.SimpleQueue()
        self._last = -float("inf")
        self._thread = threading.Thread(target=self._loop, name="ferret-arrivals", daemon=True)

    def start(self, request: Callable[[int | None], object]) -> DriftReplanner:
        """Re-plan through ``request(budget)`` (the control plane's re-planner, which takes None as
        unconstrained) from now on."""
        self.request = request
        self._thread.start()
        return self

    def assign(self, partitions: Collection[int]) -> None:
        """From the loop thread: the sample partitions assigned to this trainer."""
        self.rate.assign(partitions)

    def observe(self, event_time_ms: int, partition: int, headers: Headers | None = None) -> None:
        """From the loop thread, per valid arrival: a declared rate in the record's headers (offered when it
        changes), then the measured rate; offers never block."""
        if headers:
            declared = declared_interval(headers, len(self.rate.partitions))
            if declared is not None and declared != self.declared:
                self.declared = declared
                self.offer(declared, declared=True)
        estimate = self.rate.observe(event_time_ms, partition)
        if estimate is not None:
            self.offer(estimate)

    def offer(self, estimate: float, *, declared: bool = False) -> None:
        """From the loop thread: never blocks. A ``declared`` interval re-plans without the cooldown."""
        self._estimates.put((estimate, declared))

    def close(self) -> None:
        if self._thread.is_alive():
            self._estimates.put(None)
            self._thread.join(10)

    def drifted(self, estimate: float) -> bool:
        planned = self.planners.current.arrival_interval
        return not planned / self.ratio <= estimate <= planned * self.ratio

    def scale_drifted(self, scale: float) -> bool:
        planned = self.planners.current.settings.time_scale
        return not planned / self.ratio <= scale <= planned * self.ratio

    def _loop(self) -> None:
        while (offered := self._estimates.get()) is not None:
            estimate, declared = offered
            cooling = time.monotonic() - self._last < self.cooldown_s
            scale = self.time_scale() if self.time_scale is not None and not cooling else None
            scaled = scale is not None and self.scale_drifted(scale)
            drifted = self.drifted(estimate)
            if not scaled and (not drifted or (cooling and not declared)):
                continue
            self._last = time.monotonic()
            try:
                interval = estimate if drifted else self.planners.current.arrival_interval
                self.replan(interval, time_scale=scale if scaled else None)
            except Exception as exc:  # a failed re-plan keeps the plan in force; the stream goes on
                log.error("re-planning for the measured arrival interval %.4g s failed: %s", estimate, exc)

    def replan(self, estimate: float, *, time_scale: float | None = None) -> None:
        """Rebuild the planner for ``estimate`` seconds between arrivals (and, when given, the measured
        ``time_scale``; else the planner's) and re-plan (same budget; None stays unconstrained)."""

        def change(settings: PlannerSettings) -> PlannerSettings:
            settings = replace(settings, arrival_interval=estimate)
            return settings if time_scale is None else replace(settings, time_scale=time_scale)

        old, _ = self.planners.rebuild(change)
        if time_scale is not None:
            self.scale_replans += 1
            log.info(
                "measured service time %.3g × the profile's (plan made for %.3g ×): re-planning",
                time_scale,
                old.settings.time_scale,
            )
        if time_scale is not None and estimate == old.arrival_interval and self._same_shape():
            log.info("the measured time scale keeps the plan's shape: the plan in force runs on (no drain)")
            return
        log.info("measured arrival interval %.4g s (plan made for %.4g s): re-planning", estimate, old.arrival_interval)
        self.request(self.budget())
        self.replans += 1

    def _same_shape(self) -> bool:
        """Whether the current planner's plan for the budget has the plan in force's partition and workers
        (only its times differ: re-applying it would drain and rebuild the same pipeline)."""
        if self.plan_in_force is None:
            return False
        new, old = self.planners.plan(self.budget()), self.plan_in_force()
        return (new.partition, new.workers) == (old.partition, old.workers)


def _not_started(budget: int | None) -> object:
    raise RuntimeError("DriftReplanner.start(request) was not called")
