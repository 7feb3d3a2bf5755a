"""The trainer's status, assembled in one function from the counters, the ledger, the learner and the
plan in force: what GetStatus replies (``services.control.messages.status_reply`` maps it to the proto,
the one place where a proto field's name differs) and what the metrics endpoint exports. Every quantity
keeps one name from the counters to the snapshot: ``skipped``, ``dead_lettered``, ``planned_bytes``, …"""

from __future__ import annotations

import time
from collections.abc import Callable

from ferret_core.engine import SkipReason
from services.control.trainer_port import TrainerStatus
from services.trainer.checkpoints import Checkpoints
from services.trainer.counters import StreamCounters
from services.trainer.lag import PartitionLag
from services.trainer.learner import GuardCounts, Learner, LearnerStats
from services.trainer.ledger import OffsetLedger
from services.trainer.state import Lifecycle, PlanInForce


class StatusView:
    """Reads the trainer's parts; cheap (WatchStatus and every metrics scrape call it)."""

    def __init__(
        self,
        *,
        instance_id: str,
        counters: StreamCounters,
        ledger: OffsetLedger,
        learner: Learner,
        plan: PlanInForce,
        lifecycle: Lifecycle,
        checkpoints: Checkpoints,
        lag: PartitionLag | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.counters = counters
        self.ledger = ledger
        self.learner = learner
        self.plan = plan
        self.lifecycle = lifecycle
        self.checkpoints = checkpoints
        self.lag = lag or PartitionLag()
        self.extra_counters: list[Callable[[], dict[str, int]]] = []  # others' status counters (the calibration's)
        self._started = time.monotonic()

    def learner_stats(self) -> LearnerStats:
        return self.learner.stats()

    def mean_staleness(self) -> float | None:
        return self.learner.stats().mean_staleness

    def status(self) -> TrainerStatus:
        stats = self.learner.stats()
        plan, plan_version = self.plan.get()
        c = self.counters
        lag = self.lag.reading()
        guard = stats.guard or GuardCounts()
        with c.lock:
            latency = c.latency_ms.get()
            skipped = dict(c.skipped)
            if stats.non_finite:  # decided during training, counted by the learner
                skipped[SkipReason.NON_FINITE] = skipped.get(SkipReason.NON_FINITE, 0) + stats.non_finite
            elapsed = max(1e-9, time.monotonic() - self._started)
            return TrainerStatus(
                state=self.lifecycle.state,
                instance_id=self.instance_id,
                items_received=c.items_received,
                items_valid=c.items_valid,
                items_dispatched=c.items_dispatched,
                predictions_published=c.predictions_published,
                duplicates_published=c.duplicates_published,
                backward_passes=stats.backward_passes,
                labels_joined=c.labels_joined,
                skipped=skipped,
                dead_lettered=dict(c.dead_lettered),
                labelled_predictions=c.online.count,
                correct_predictions=c.online.correct,
                online_accuracy=c.online.get(),
                budget_bytes=plan.budget_bytes,
                # the method's own bytes where it plans them (a schedule on Ferret's partition), else the plan's
                planned_bytes=plan.planned_bytes if stats.planned_bytes is None else stats.planned_bytes,
                measured_bytes=stats.measured_bytes,  # peak under the plan in force
                lag_items=lag.items,
                lag_seconds=lag.seconds,
                lag_items_by_partition=lag.by_partition,
                items_per_second=c.items_valid / elapsed,
                latency_ms_p50=float(latency.get("p50", 0.0)),
                latency_ms_p99=float(latency.get("p99", 0.0)),
                model_version=stats.model_version,
                plan_version=plan_version,
                replans=c.replans,
                pauses=c.pauses,
                last_snapshot_version=self.checkpoints.last_version,
                compensations_truncated=stats.compensations_truncated,
                rollbacks=guard.rollbacks,
                promotions=guard.promotions,
                drifts=guard.drifts,
                last_good_version=guard.last_good_version,
                model_lineage=stats.model_lineage,
                counters={
                    **staleness_counters(stats),
                    **host_counters(plan.host_bytes),
                    **{k: v for extra in self.extra_counters for k, v in extra().items()},
                },
                freshness=stats.freshness,
                planned_host_bytes=plan.host_bytes,
            )


def host_counters(host_bytes: tuple[int, ...]) -> dict[str, int]:
    """Several hosts: the plan's planned bytes on each host (``planned_host_bytes.<rank>``, rank 0 the
    trainer's: record path and follower copies); none on one host."""
    return {f"planned_host_bytes.{rank}": int(b) for rank, b in enumerate(host_bytes)}


def staleness_counters(stats: LearnerStats) -> dict[str, int]:
    """Per stage j of the plan in force, the largest staleness applied (``staleness_max.<j>``) beside the
    schedule's bound (``staleness_bound.<j>``): the wall clock does not enforce the bound (docs/service.md)."""
    out = {f"staleness_max.{j}": int(v) for j, v in enumerate(stats.max_staleness)}
    out.update({f"staleness_bound.{j}": int(v) for j, v in enumerate(stats.staleness_bound)})
    if stats.freshness is not None:  # several hosts: the predicting copies' lag behind the newest master
        f = stats.freshness
        out.update(
            {
                "freshness_predictions": f.predictions,
                "freshness_updates_p50": round(f.updates_p50),
                "freshness_updates_p99": round(f.updates_p99),
                "freshness_updates_max": f.updates_max,
                "freshness_ms_p50": round(f.ms_p50),
                "freshness_ms_p99": round(f.ms_p99),
                "freshness_ms_max": round(f.ms_max),
            }
        )
    return out
