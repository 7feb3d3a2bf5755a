"""The trainer's learner on executor processes: ferret_core's :class:`ProcessClock` runs the planner's
N workers × P stages as OS processes over a master in shared memory, so training runs on the other cores
while the record path (consume, decode, predict, publish, commit) keeps this process's interpreter.

Arrivals queued by :meth:`ProcessLearner.submit` are predicted together, in one forward pass on the
current master (pinned in shared memory: a prediction never waits for training), when the first of
them is asked for its outcome, then dispatched one by one in submission order with the process clock's
admission rule: item i goes to worker i mod N, skipped ``busy`` when as many items already wait for that
worker as the wall clock's wait W allows (:func:`queue_depth`). A re-plan that
keeps the partition, the worker slots and the live workers keeps the processes (drain, reconfigure
T1–T3: milliseconds); any other drains, copies the master into the model's units and starts a clock for
the new plan, whose version slots fit its live workers (docs/processes.md "Re-plans").

What differs from the thread learner (:mod:`services.trainer.engine_learner`), said where it shows:

* the compensators' state is shared per stage by its executors (λ, the EMAs or mean square, Gap-Aware's C
  and n, Alg. 1's ring: :mod:`ferret_core.engine.processes`), so snapshots carry it in the thread learner's
  format and either learner's snapshot loads (:meth:`ProcessLearner.load_compensator_state`); a new clock
  (a re-plan that needs one, a restarted executor) carries it on as the thread learner carries it across a
  re-plan, except Alg. 1's ring, which starts empty (its deltas are of the old clock's versions);
* ``measured_bytes`` (and ``peak_bytes``) is :meth:`ProcessClock.measured_bytes`: the shared version
  slots and, for Iter-Fisher and Gap-Aware, the stages' shared delta rings or average steps (counted once
  however many processes map them), plus every executor's measured peak of what it holds in its own
  process (activations and saved tensors of items in flight, sends, gradients, T2's buffer, compensator
  state), sampled there after each action: an upper bound of the simultaneous total. The coordinator's
  own tensors (queued arrivals, a prediction's activations) and each process's runtime are not in it;
* admission reads W as a queue depth (:func:`queue_depth`), not per item by its event time;
* an executor process that dies (kill -9, the OOM killer) is started again in place from the newest
  weights that cannot be torn, the stream going on where it is (:meth:`ProcessLearner._recover`); a
  failure raised *by* training code still stops the trainer (the record is blamed, as on threads).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ferret_core.engine import SkipReason
from ferret_core.engine.admission import AdmissionSettings
from ferret_core.engine.carry import carry_compensator_states, same_stages
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.wall_clock import Arrival
from ferret_core.errors import ConfigError, ExecutorLost, ScheduleError
from ferret_core.plan import Plan
from ferret_core.planning.placement import stage_owners
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel
from services.config import Settings
from services.trainer.learner import ArrivalOutcome, LearnerFailed, LearnerStats
from services.trainer.lineage import Lineage
from services.trainer.live_methods import live_setup, not_planned, plans_for_budget
from services.trainer.unit_weights import (
    arrival_outcome,
    copy_into_units,
    largest_weight,
    load_snapshot_tensors,
    snapshot_tensors,
)

log = logging.getLogger("ferret.trainer")

DELIVERY_JITTER_S = 0.02  # the least spread of a consumer batch's arrivals that may wait for a worker (queue_depth)
MAX_DELIVERY_S = 0.25  # the most: the training delay one queue of admitted work may add (queue_depth)
DELIVERY_EMA = 0.2  # weight of the newest interval between consumer batches in its running mean
MAX_EXECUTOR_RESTARTS = 3  # executor deaths within RESTART_WINDOW_S restarted in process; more stop the trainer
RESTART_WINDOW_S = 600.0
DEPTH_EVERY = 16  # flushes between re-reads of the measured service time and delivery interval for queue_depth
ROUTER_SWITCH_INTERVAL_S = 2e-4  # sys.setswitchinterval for a trainer on executor processes (see __init__)


def queue_depth(admission: AdmissionSettings, service_s: float | None = None, delivery_s: float | None = None) -> int:
    """How many items may wait for a worker on executor processes: the wall clock's rule read as a queue
    depth. The wall clock admits an item iff its worker would start it within W of its event time, W read
    in the machine's time (W × measured ÷ profiled service time); here up to that many items' worth of
    work plus a *delivery* term may wait: ⌊W / profiled + D / measured⌋ (``service_s``: the worker's
    measured service time, the profiled one until measured), never more than the queue's K.

    D is the interval between the consumer batches the record path hands over (``delivery_s``, measured;
    clamped to [:data:`DELIVERY_JITTER_S`, :data:`MAX_DELIVERY_S`]): a batch's items arrive together although
    their event times are spread over that interval, and the worker can train D / measured of them before
    the next batch comes. Without a bound the queue filled to K = 256 at 2x saturation and the master
    predicting an item lagged hundreds of updates behind what was admitted (measured: 299 updates by the
    last of 1000 items with 556 trained); with W alone (about one item) a delivered batch was mostly
    skipped ``busy`` while the executor idled between round trips; with a fixed D of 20 ms (about 5
    MNISTNet items) a batch of 32 delivered every 0.4 s had 429 of 600 items skipped ``busy`` while the
    worker, at 4.4 ms an item, idled most of each interval (the live demo trained 1,195–2,319 of 6,000
    items where the plain loop trained 4,484–4,680: ``benchmarks/live/README.md``)."""
    profiled = admission.profile_service_s
    if profiled <= 0:
        return admission.queue_slots
    measured = service_s if service_s is not None and service_s > 0 else profiled
    delivery = DELIVERY_JITTER_S if delivery_s is None else min(MAX_DELIVERY_S, max(DELIVERY_JITTER_S, delivery_s))
    depth = math.floor(admission.max_wait_s / profiled + delivery / measured + 1e-9)
    return min(admission.queue_slots, depth)


class ProcessLearner:
    """Implements :class:`services.trainer.learner.Learner` over a :class:`ProcessClock`."""

    def __init__(
        self,
        model: ZooModel,
        plan: Plan,
        settings: Settings,
        profile: ModelProfile | None = None,
        *,
        hosts: Hosts | None = None,
    ) -> None:
        t = settings.trainer
        self.model = model
        self.hosts = hosts  # several hosts: every clock places its stages there (ferret_core.planning.placement)
        self.profile = profile
        self.method = t.method
        self.plans_for_budget = plans_for_budget(self.method)
        self.compensator = t.compensator
        self.lr = t.lr
        self.top_k = t.prediction_top_k
        self.process_settings = ProcessSettings(
            lr=t.lr,
            compensator=t.compensator,
            compensator_settings=t.compensator_config(),
            threads=1,
            flush_denormal=True,  # as the trainer's own process (torch.set_flush_denormal)
            retain_heap=t.retain_freed_memory,  # as the trainer's own process (ferret_core.engine.heap)
            keep_trace=False,
            top_k=max(1, t.prediction_top_k),
            max_step_ratio=settings.guard.max_step_ratio,  # the norm guard (ferret_core.engine.step_guard)
        )
        self._queued: list[tuple[int, torch.Tensor, int | None]] = []
        self._flushes = 0
        self._last_flush_at: float | None = None  # when the last consumer batch was handed over (perf_counter)
        self._delivery_s: float | None = None  # running mean of the intervals between consumer batches
        self._admission: AdmissionSettings | None = None
        self._outcomes: dict[int, Arrival | Exception] = {}
        self._peak_before = 0
        self._updates_before = 0
        self.lineage = Lineage()  # what model versions count along (a restore or a restart from last-good: new)
        self._backprops_before = 0
        self._non_finite_before = 0
        self.recovery_seconds: list[float] = []  # per executor restart (_recover), its duration
        self._deaths: list[float] = []
        self._last_good: dict[str, torch.Tensor] | None = None
        self._started_at = 0
        self.replans_kept = 0  # re-plans that kept the executor processes
        self.replans_rebuilt = 0  # re-plans that started a new clock
        # the router thread answers every executor report: let it take the GIL from the record path within
        # ~0.2 ms instead of Python's default 5 ms switch interval, which idled the executor each action
        sys.setswitchinterval(ROUTER_SWITCH_INTERVAL_S)
        self.clock = self._start(plan)

    def _setup(self, plan: Plan) -> PolicySetup:
        setup, admission = live_setup(
            self.method,
            plan,
            self.model.name,
            self.model.num_units,
            profile=self.profile,
            compensator=self.compensator,
            executors="processes",
        )
        self._admission = admission
        self._queue_slots = None if admission is None else queue_depth(admission)
        return setup

    def _start(self, plan: Plan) -> ProcessClock:
        self._started_at = self._updates_before  # the model version of the weights the clock starts from
        setup = self._setup(plan)
        settings = dataclasses.replace(self.process_settings, queue_slots=self._queue_slots)
        self._policy = setup
        if self.hosts is not None:
            self.hosts.place(stage_owners(plan.num_stages, self.hosts.world_size))
            log.info(
                "%d stage(s) owned by ranks %s of %d hosts",
                plan.num_stages,
                list(self.hosts.owners),
                self.hosts.world_size,
            )
        return ProcessClock(self.model.units, setup, settings, hosts=self.hosts).start()

    @property
    def plan(self) -> Plan:
        return self._policy.plan

    @property
    def executor_restarts(self) -> int:
        """Executor processes that died and were started again in place (:meth:`_recover`)."""
        return len(self.recovery_seconds)

    # -- the record path's call ------------------------------------------------------------------------
    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        """Queue the item; the returned call predicts everything queued (one forward pass) and returns this
        item's prediction and dispatch. ``event_time_ms`` is not read (module docstring)."""
        self._queued.append((item, x, y))

        def outcome() -> ArrivalOutcome:
            if item not in self._outcomes:
                self._flush()
            arrival = self._outcomes.pop(item)
            if isinstance(arrival, Exception):
                raise arrival
            return arrival_outcome(
                arrival, self._updates_before, self.top_k, self._largest_weight, self.lr, self.lineage.value
            )

        return outcome

    def _flush(self) -> None:
        queued, self._queued = self._queued, []
        if not queued:
            return
        self._flushes += 1
        now = time.perf_counter()
        if self._last_flush_at is not None:
            interval = min(MAX_DELIVERY_S, now - self._last_flush_at)  # an idle stream says nothing past the cap
            last = self._delivery_s
            self._delivery_s = interval if last is None else last + DELIVERY_EMA * (interval - last)
        self._last_flush_at = now
        if self._admission is not None and self._flushes % DEPTH_EVERY == 0:
            self._follow_service_time(self._admission)
        items = [i for i, _, _ in queued]
        xs, ys = [x for _, x, _ in queued], [y for _, _, y in queued]
        try:
            try:
                arrivals = self.clock.submit_many(xs, ys, items)
            except ExecutorLost as lost:  # nothing of the batch was predicted yet: restart, then submit it
                self._recover(lost)
                arrivals = self.clock.submit_many(xs, ys, items)
        except Exception as exc:
            failed = self.clock.failed_item
            for i in items:
                error = LearnerFailed(i if failed is None else failed, exc)
                error.__cause__ = exc
                self._outcomes[i] = error
            return
        for arrival in arrivals:
            self._outcomes[arrival.index] = arrival

    def _recover(self, lost: ExecutorLost) -> None:
        """An executor process died: start the plan's executors again, in this process, from the newest
        weights that cannot be torn, and go on with the stream where it is (no item is read again, so none
        gets a second outcome). The master in shared memory is consistent unless the process died inside an
        in-place update, which holds the slot table's lock it never releases: then the weights of the last
        snapshot (or, before any, those the executors started from) are used. What the dead executor had
        admitted but not trained is lost (its items' predictions are published). More than
        :data:`MAX_EXECUTOR_RESTARTS` deaths within :data:`RESTART_WINDOW_S` raise: the trainer stops and
        its supervisor starts it again from its last snapshot and committed offsets."""
        began = time.perf_counter()
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < RESTART_WINDOW_S]
        if len(self._deaths) >= MAX_EXECUTOR_RESTARTS:
            raise lost
        self._deaths.append(now)
        compensators: list[dict[str, Any]] | None = None
        try:
            state = self.clock.unit_state()  # raises where a dead process holds the slot table's lock
            source = "the master in shared memory"
        except ScheduleError:
            state = None
        if state is not None:
            try:  # raises where the dead process holds a stage's update lock: the compensators start fresh
                compensators = self.clock.compensator_states(timeout=0.5)
            except ScheduleError as exc:
                log.warning("compensator state not carried to the restarted executors: %s", exc)
        self._retire_counts()
        self.clock.close(reraise=False)
        if state is not None:
            copy_into_units(self.model, state)
        elif self._last_good is not None:
            self._updates_before = load_snapshot_tensors(self.model, self._last_good)  # the version goes back
            self.lineage.branch()
            source = "the last snapshot's weights"
        else:
            self._updates_before = self._started_at  # the units still hold what this clock started from
            self.lineage.branch()
            source = "the weights the executors started from"
        self.clock = self._start(self.plan)
        self._carry_compensators(compensators, same_partition=True)
        self.recovery_seconds.append(time.perf_counter() - began)
        log.warning(
            "%s; executors restarted from %s in %.0f ms (restart %d)",
            lost,
            source,
            1000 * self.recovery_seconds[-1],
            self.executor_restarts,
        )

    def _follow_service_time(self, admission: AdmissionSettings) -> None:
        """Re-size the admission queue for the slowest worker's measured service time and the measured
        interval between consumer batches (:func:`queue_depth`)."""
        measured = [t for t in self.clock.measured_service_times() if t is not None]
        depth = queue_depth(admission, max(measured) if measured else None, self._delivery_s)
        if depth != self._queue_slots:
            self._queue_slots = depth
            self.clock.set_queue_slots(depth)

    def pending_training(self) -> bool:
        return False  # training runs in the executor processes

    def train_step(self) -> bool:
        return False

    def trace_view(self) -> dict[str, float | int | None]:
        return {}

    def measured_service_times(self) -> list[float | None]:
        """Per worker, its executors' busy seconds per item at the slowest stage (None until measured): the
        drift re-planner scales the profile by it (docs/planner.md reading 11)."""
        return list(self.clock.measured_service_times())

    def _largest_weight(self) -> float:
        return largest_weight(self.clock.unit_state())

    def drain(self, timeout: float | None = None) -> None:
        self._flush()
        try:
            self.clock.drain(timeout)
        except ExecutorLost as lost:  # what was in flight is lost; the restarted executors are idle
            self._recover(lost)

    # -- re-plans ---------------------------------------------------------------------------------------
    def apply_plan(self, plan: Plan) -> None:
        """Run ``plan`` from here on: on the same processes where it keeps the partition, the worker slots
        and the live workers, else on a new clock started from the drained master."""
        if not self.plans_for_budget:
            raise not_planned(self.method)
        if plan.partition.num_units != self.model.num_units:
            raise ConfigError(
                f"plan for {plan.partition.num_units} units cannot drive {self.model.name!r} "
                f"({self.model.num_units} units)"
            )
        self.drain()
        if self._keeps_processes(plan):
            setup = self._setup(plan)
            self.clock.replan(setup, queue_slots=self._queue_slots)
            self._policy = setup
            self.replans_kept += 1
            return
        old_plan = self.plan
        self._rebuild(plan, old_plan)
        self.replans_rebuilt += 1

    def _keeps_processes(self, plan: Plan) -> bool:
        """Whether ``plan`` runs on the processes in force: the same partition, worker slots and live
        workers (T1–T3 change; a T4 change starts a new clock, whose version slots fit its live workers)."""
        old = self.plan
        if plan.partition != old.partition or plan.num_workers != old.num_workers:
            return False
        return [w.live for w in plan.workers] == [w.live for w in old.workers]

    def _rebuild(self, plan: Plan, fallback: Plan) -> None:
        """Close the clock (drained) and start one for ``plan`` from the master's weights; if that fails,
        ``fallback`` runs on (its weights are in the units) and the error is raised."""
        copy_into_units(self.model, self.clock.unit_state())
        states = self.clock.compensator_states()
        self._retire_counts()
        self.clock.close()
        try:
            self.clock = self._start(plan)
        except BaseException:
            self.clock = self._start(fallback)
            self._carry_compensators(states, same_partition=True)
            raise
        self._carry_compensators(states, same_partition=plan.partition == fallback.partition)

    def _retire_counts(self) -> None:
        """Fold the closing clock's counters into the totals kept across clocks."""
        stats = self.clock.stats()
        self._peak_before = max(self._peak_before, stats.peak_bytes or 0)
        self._updates_before += stats.updates
        self._backprops_before += stats.trained_any_stage
        self._non_finite_before += stats.skipped.get(SkipReason.NON_FINITE.value, 0)

    # -- state -----------------------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The snapshot's tensors (taken drained); kept as the last good weights for :meth:`_recover`."""
        self._last_good = snapshot_tensors(
            self.clock.unit_state(), self._updates_before + self.clock.updates(), self.lineage.value
        )
        return self._last_good

    def master_tensors(self) -> dict[str, torch.Tensor]:
        """The master in shared memory now (not drained; ``_last_good`` is left alone)."""
        version = self._updates_before + self.clock.updates()
        return snapshot_tensors(self.clock.unit_state(), version, self.lineage.value)

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.drain()
        version = load_snapshot_tensors(self.model, tensors)
        self._last_good = dict(tensors)
        self._retire_counts()
        self._updates_before = version
        self.lineage.branch()  # the version went back (or elsewhere): a new line of updates
        plan = self.plan
        self.clock.close()
        self.clock = self._start(plan)

    def compensator_state(self) -> list[dict[str, Any]]:
        """Per stage, what the stage's executors share (:meth:`ProcessClock.compensator_states`: the thread
        learner's format), taken drained."""
        self.drain()
        return self.clock.compensator_states()

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        """What the stages' shared state can use of ``states`` (a snapshot's, from either learner, or the
        guard's start), carried as across a re-plan (:mod:`ferret_core.engine.carry`: λ, the EMAs, the mean
        square, Gap-Aware's C and n; Alg. 1's ring keeps this clock's deltas). Another compensator's states
        raise :class:`ConfigError` (the callers keep the fresh state and say so)."""
        if not states:
            return
        self.drain()
        self._load_carried(states)

    def _carry_compensators(self, states: Sequence[Mapping[str, Any]] | None, same_partition: bool) -> None:
        """Into the clock just started: what it can use of the closed clock's ``states`` (None: none were
        readable). A state that does not fit leaves the new clock's fresh, with a warning: a re-plan or a
        recovery does not fail for it."""
        if not states:
            return
        try:
            self._load_carried(states, same_partition)
        except (ConfigError, ScheduleError) as exc:
            log.warning("compensator state not carried to the new executors (they start fresh): %s", exc)

    def _load_carried(self, states: Sequence[Mapping[str, Any]], same_partition: bool | None = None) -> None:
        """Load into the clock what its stages can use of ``states`` (:func:`carry_compensator_states`);
        ``same_partition`` None: judged from the states themselves (:func:`same_stages`)."""
        fresh = self.clock.compensator_states()
        same = same_stages(states, fresh) if same_partition is None else same_partition
        self.clock.load_compensator_states(carry_compensator_states(states, fresh, same_partition=same))

    def stats(self) -> LearnerStats:
        stats = self.clock.stats()
        measured = stats.peak_bytes or 0
        counted = [m for m, n in zip(stats.mean_staleness, stats.updates_per_stage, strict=True) if n]
        planned = self._policy.planned
        return LearnerStats(
            backward_passes=self._backprops_before + stats.trained_any_stage,
            model_version=self._updates_before + stats.updates,
            measured_bytes=measured,
            peak_bytes=max(self._peak_before, measured),
            mean_staleness=sum(counted) / len(counted) if counted else None,
            planned_bytes=None if planned is None else planned.planned_bytes,
            max_staleness=stats.max_staleness,
            staleness_bound=stats.staleness_bound,
            non_finite=self._non_finite_before + stats.skipped.get(SkipReason.NON_FINITE.value, 0),
            model_lineage=self.lineage.value,
            freshness=None if self.hosts is None else self.hosts.freshness(),
        )

    def close(self) -> None:
        try:
            self.drain()
        finally:
            self.clock.close()
