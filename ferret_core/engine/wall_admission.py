"""The wall clock's admission by event time and the executors' measured service times.

An arrival submitted with an ``event_time``, under ``admission`` settings, is admitted by event time
(:mod:`ferret_core.engine.admission`): its worker takes it iff its queue holds fewer than
``queue_slots`` items and it would start the item within ``max_wait_s`` of its event time at the
worker's measured service time (:class:`~ferret_core.engine.admission.ServiceTimes`). Each action's cost
is counted from the end of the executor's previous action when it went straight on, because the
bookkeeping, lock and GIL waits between a busy worker's actions are part of what an item costs: counting
the actions alone under-estimates a worker that shares the CPU with the record path, and the rule then
admits more than it trains (the real queue, up to K, grows behind the predictions). Without an event
time or settings, the policy's own slot rule decides (:mod:`ferret_core.schedule.scheduler`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ferret_core.engine.admission import AdmissionSettings, EventTimeAdmission, ServiceTimes
from ferret_core.engine.pipeline import Pipeline

log = logging.getLogger("ferret.admission")


class ClockAdmission:
    """What the executors' actions cost, per worker and stage (``service_times``, and the action and
    charged seconds summed), and the event-time rule built on it (``settings``: ``None`` when arrivals are
    admitted by the policy's slot rule alone)."""

    def __init__(self, pipeline: Pipeline, settings: AdmissionSettings | None) -> None:
        self.pipeline = pipeline
        plan = pipeline.plan
        initial = plan.stage_forward_time + plan.stage_backward_time
        if settings is not None:
            initial = max(initial, settings.initial_service_s)
        self.service_times = ServiceTimes(plan.num_workers, plan.num_stages, initial)
        self.settings = settings
        self._event_rule = None if settings is None else EventTimeAdmission(plan.num_workers, settings.max_wait_s)
        self.executor_seconds = 0.0  # the executors' action wall time, summed (view)
        self.charged_seconds = 0.0  # what ServiceTimes was charged for them (incl. the gaps between actions)

    def charge(self, worker: int, stage: int, action_s: float, charged_s: float, *, forward: bool) -> None:
        """An action of executor (``worker``, ``stage``) took ``action_s`` seconds and costs the worker
        ``charged_s`` (under the pipeline's lock)."""
        self.executor_seconds += action_s
        self.charged_seconds += charged_s
        self.service_times.record(worker, stage, charged_s, forward=forward)

    def measured(self) -> tuple[float | None, ...]:
        """Per worker, its measured busy seconds per item at its slowest stage (``None``: not measured)."""
        return tuple(self.service_times.measured(n) for n in range(self.pipeline.plan.num_workers))

    def view(self, worker: int) -> dict[str, float | int | None]:
        """What the rule believes for ``worker`` now (read without the lock): its service time s and W in
        the machine's time (seconds), the real queue's bound ⌊(W + H)/s⌋, the items waiting for it, and the
        executors' action seconds and charged seconds so far."""
        service_s = self.service_times.service_time(worker)
        settings = self.settings
        wait_s = None if settings is None else settings.wait_for(service_s)
        slots = None if settings is None or wait_s is None else settings.start_slots(wait_s, service_s)
        return {
            "service_s": service_s,
            "wait_s": wait_s,
            "start_slots": slots,
            "waiting": self.pipeline.scheduler.waiting(worker),
            "executor_s": self.executor_seconds,
            "charged_s": self.charged_seconds,
        }

    def rule(self, event_time: float | None) -> Callable[[int], bool] | None:
        """Admission by event time for one arrival (None: the policy's slot rule decides)."""
        settings, rule = self.settings, self._event_rule
        if settings is None or rule is None or event_time is None:
            return None
        scheduler, service = self.pipeline.scheduler, self.service_times

        def admit(worker: int) -> bool:
            service_s = service.service_time(worker)
            wait_s = settings.wait_for(service_s)  # W in the machine's time (admission.py)
            if not scheduler.can_admit(worker, settings.queue_slots):
                self._log_busy("queue full", worker, event_time, service_s, wait_s)
                return False
            start_slots = settings.start_slots(wait_s, service_s)
            if start_slots is not None and not scheduler.can_admit(worker, start_slots):
                self._log_busy("would start > W + H from now", worker, event_time, service_s, wait_s)
                return False
            if not rule.admit(worker, event_time, service_s, wait_s):
                self._log_busy("would wait > W", worker, event_time, service_s, wait_s)
                return False
            return True

        return admit

    def _log_busy(self, why: str, worker: int, event_time: float, service_s: float, wait_s: float) -> None:
        """At DEBUG (logger ``ferret.admission``), why an item was skipped ``busy``: the rule's inputs (service
        time, wait, event time) for diagnosing skips at a rate the worker should keep up with."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        settings, rule = self.settings, self._event_rule
        assert settings is not None and rule is not None
        log.debug(
            "busy (%s): worker %d, event time %.3f s, wait %.4f s vs W %.4f s, queue %d vs K %d, service %.5f s",
            why, worker, event_time, rule.wait(worker, event_time), wait_s,
            self.pipeline.scheduler.waiting(worker), settings.queue_slots, service_s,
        )  # fmt: skip
