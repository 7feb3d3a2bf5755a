"""Re-planning under a new memory budget, off the request thread, newest request wins.

``Replanner.request(budget)`` validates the budget, hands the work to one dedicated worker thread and
waits for it. ``None`` is a budget too: "unconstrained" (the paper's M+), planned as ``planner.plan(None)``,
so the plan's ``budget_bytes`` stays None and status and metrics show no budget. Re-plans that keep the
budget in force (the trainer's arrival-rate re-plans) pass it through as it is, None included: an
unconstrained trainer stays unconstrained.

The worker runs ``planner.plan(budget)`` (the Planner built once at start-up from the start-up profile:
it caches its search paths, so re-planning never re-times layers) and then ``trainer.apply_plan``. Every
request takes the next *generation*; a request whose generation is no longer the newest when it reaches
the worker, or when its planning ends, raises :class:`Superseded` (gRPC ABORTED) and is not applied, so
a burst of budget changes applies only the last one. An infeasible budget raises the planner's
``InfeasibleBudgetError`` (FAILED_PRECONDITION) and leaves the plan in force unchanged. Readiness is
NOT_SERVING while the worker plans and applies; liveness is guarded by a deadline (a re-plan running
longer than ``stuck_after_s`` means the process is wedged). A request with the caller's ``deadline``
(:class:`~services.control.deadline.CallDeadline`) whose deadline has passed when the worker picks it
up, when its planning ends, or when the trainer loop's turn comes is not applied (``DeadlineExpired``,
gRPC DEADLINE_EXCEEDED: the client already gave up); one whose deadline passes while the swap runs
completes, and GetPlan shows it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from ferret_core.plan import Plan
from services.control.deadline import CallDeadline
from services.control.errors import InvalidRequest, ServiceUnavailable, Superseded
from services.control.health import ControlHealth
from services.control.trainer_port import TrainerPort
from services.failpoints import failpoint

# Anything above 1 EiB is a typo, not a budget.
MAX_BUDGET_BYTES = 2**60

log = logging.getLogger(__name__)


class PlannerLike(Protocol):
    """What the re-planner needs of ``ferret_core.planning.planner.Planner``."""

    def plan(self, budget_bytes: int | None = None) -> Plan: ...


@dataclass(frozen=True)
class ReplanOutcome:
    """An applied re-plan: the plan, its version and what it cost."""

    plan: Plan
    version: int
    generation: int
    budget_bytes: int | None  # None: unconstrained
    planning_seconds: float  # planner.plan() alone
    stall_seconds: float  # the pause the trainer reported for the swap
    applied_time_ms: int
    seconds: float = 0.0  # the whole re-plan on the worker: planning, waiting for the loop, applying


def validate_budget(budget_bytes: int) -> int:
    """The budget as an int, or :class:`InvalidRequest` when it is not a positive, sane byte count."""
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int):
        raise InvalidRequest(f"budget_bytes must be an integer number of bytes, got {budget_bytes!r}")
    if budget_bytes <= 0:
        raise InvalidRequest(f"budget_bytes must be > 0, got {budget_bytes}; e.g. 536870912 (512 MiB)")
    if budget_bytes > MAX_BUDGET_BYTES:
        raise InvalidRequest(
            f"budget_bytes {budget_bytes} is above the sanity limit {MAX_BUDGET_BYTES} (1 EiB); "
            "check the unit (the value is in bytes)"
        )
    return budget_bytes


class Replanner:
    """Serialises re-plans on one worker thread; see the module docstring for the rules."""

    def __init__(
        self,
        planner: PlannerLike,
        trainer: TrainerPort,
        health: ControlHealth | None = None,
        stuck_after_s: float = 300.0,
        on_applied: Callable[[ReplanOutcome], None] | None = None,
    ) -> None:
        self._planner = planner
        self._on_applied = on_applied  # e.g. the metrics' re-plan histograms
        self._trainer = trainer
        self._health = health or ControlHealth()
        self._stuck_after_s = stuck_after_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ferret-replan")
        self._lock = threading.Lock()
        self._generation = 0
        self._running = False
        self._closed = False
        self._last: ReplanOutcome | None = None

    @property
    def generation(self) -> int:
        """The newest request's generation (0 before the first)."""
        with self._lock:
            return self._generation

    @property
    def busy(self) -> bool:
        """Whether the worker is planning or applying now."""
        with self._lock:
            return self._running

    @property
    def last_outcome(self) -> ReplanOutcome | None:
        with self._lock:
            return self._last

    def request(self, budget_bytes: int | None, *, deadline: CallDeadline | None = None) -> ReplanOutcome:
        """Plan for ``budget_bytes`` (None: unconstrained) and apply the plan; blocks the caller (not the
        worker) until done. ``deadline``: the caller's; once passed, the re-plan is not applied (module
        docstring).

        Raises :class:`InvalidRequest`, ``InfeasibleBudgetError``, :class:`Superseded`,
        :class:`ServiceUnavailable` (closed), ``DeadlineExpired``, or whatever ``apply_plan`` raised.
        """
        budget = None if budget_bytes is None else validate_budget(budget_bytes)
        with self._lock:
            if self._closed:
                raise ServiceUnavailable("the control plane is shutting down; the budget was not changed")
            self._generation += 1
            generation = self._generation
            future = self._executor.submit(self._run, budget, generation, deadline)
        try:
            return future.result()
        except CancelledError:
            raise ServiceUnavailable(
                "the control plane shut down before this re-plan ran; the budget was not changed"
            ) from None

    def supersede(self) -> None:
        """Make every queued or running re-plan lose (e.g. a snapshot restore replaces the plan)."""
        with self._lock:
            self._generation += 1

    def close(self, wait: bool = True) -> None:
        """Refuse new requests and cancel queued ones (their callers get :class:`ServiceUnavailable`);
        with ``wait``, also wait for the running one to end."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=True)

    def _check_newest(self, budget: int | None, generation: int) -> None:
        with self._lock:
            if generation != self._generation:
                raise Superseded(budget, generation, self._generation)

    def _run(self, budget: int | None, generation: int, deadline: CallDeadline | None) -> ReplanOutcome:
        what = f"re-plan #{generation} for {'no budget' if budget is None else f'{budget} bytes'}"
        self._check_newest(budget, generation)
        if deadline is not None:
            deadline.check(what)  # it waited for the worker
        with self._lock:
            self._running = True
        try:
            with self._health.replanning(), self._health.deadline("re-plan", self._stuck_after_s):
                started = time.perf_counter()
                plan = self._planner.plan(budget)
                planning_seconds = time.perf_counter() - started
                self._check_newest(budget, generation)
                if deadline is not None:
                    deadline.check(what)  # planning outlasted it
                failpoint("control.mid-replan")
                _, current_version = self._trainer.current_plan()
                applied = self._trainer.apply_plan(plan, current_version + 1, deadline)  # checked at the loop's turn
                seconds = time.perf_counter() - started
        finally:
            with self._lock:
                self._running = False
        outcome = ReplanOutcome(
            plan=plan,
            version=applied.version,
            generation=generation,
            budget_bytes=budget,
            planning_seconds=planning_seconds,
            stall_seconds=applied.stall_seconds,
            applied_time_ms=applied.applied_time_ms,
            seconds=seconds,
        )
        with self._lock:
            self._last = outcome
        if self._on_applied is not None:
            try:
                self._on_applied(outcome)
            except Exception:  # a listener (metrics) never turns an applied plan into a failed call
                log.exception("re-plan #%d was applied; its listener failed", generation)
        log.info(
            "re-plan #%d: budget %s -> plan v%d (%d stages, %d/%d workers, %d B predicted); "
            "planning %.3f s, stall %.3f s",
            generation,
            "unconstrained" if budget is None else f"{budget} B",
            applied.version,
            plan.num_stages,
            plan.live_workers,
            plan.num_workers,
            plan.planned_bytes,
            planning_seconds,
            applied.stall_seconds,
        )
        return outcome
