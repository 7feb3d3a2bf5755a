"""Prometheus metrics of the trainer, by Prometheus' conventions (``promtool check metrics`` is clean):
base units (seconds, bytes), ratios in [0, 1], counters ending in ``_total``, a help text on every
family. docs/metrics.md lists them all, with the PromQL the dashboard uses.

Counters and gauges are read from the trainer's status at scrape time (nothing is counted twice), each
named ``ferret_`` + the status field's name (+ ``_total`` for counters): the same name as in the
counters, GetStatus (``services.control.trainer_port.TrainerStatus``) and the snapshots. Where the
status keeps another unit, the metric converts and says so in its name: ``online_accuracy`` (percent) →
``ferret_online_accuracy_ratio``. Histograms are observed as things happen: the prediction latency by the
record path, the re-plans by the control plane's re-planner."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.control.replanner import ReplanOutcome
from services.control.trainer_port import TrainerState, TrainerStatus

# Event time → prediction delivered: milliseconds when the trainer keeps up, up to minutes when it lags.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# Planning takes milliseconds to seconds; applying drains the pipeline first.
REPLAN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)

COUNTERS = {
    "items_received": "Sample records consumed",
    "items_valid": "Valid items (the trainer's counter i)",
    "items_dispatched": "Items dispatched to a pipeline worker",
    "predictions_published": "Predictions published (delivered)",
    "duplicates_published": "Predictions re-emitted after a restart (duplicate=true)",
    "backward_passes": "Items back-propagated at one stage at least",
    "labels_joined": "Late labels joined to their prediction",
    "labelled_predictions": "Predictions scored against a label (online accuracy's denominator)",
    "correct_predictions": "Predictions that were correct (online accuracy's numerator)",
    "replans": "Plans applied after start-up",
    "pauses": "Consumption pauses (re-planning, snapshots, restores)",
    "compensations_truncated": "Compensations cut short: the gradient was staler than the deltas kept",
    "rollbacks": "Rollbacks of the live model to the last-good one (the guard's test found it worse)",
    "promotions": "Promotions of the live model's weights to last-good",
    "drifts": "Drifts detected on the prediction outcomes (correctness, or confidence where unlabelled)",
}
BY_REASON = {
    "skipped": "Items predicted but not trained, by reason (busy, worker_removed, no_label, omitted)",
    "dead_lettered": "Records sent to the dead-letter topic, by the codec's rejection reason",
}
GAUGES = {
    "planned_bytes": "Bytes the plan in force predicts the engine holds (the planner's cost model)",
    "measured_bytes": "Bytes the engine holds under the plan in force, measured peak",
    "lag_items": "Sample records behind the end of the assigned partitions (where known)",
    "lag_seconds": "Age (event time) of the newest consumed sample of a partition that is behind; 0 caught up",
    "plan_version": "Version of the plan in force",
    "model_version": "Optimizer updates applied to the master weights",
    "last_good_version": "Model version of the last-good weights a rollback returns to (0: not guarded)",
    "last_snapshot_version": "Version of the last snapshot written or restored (0: none)",
}
RATIOS = {"online_accuracy": ("Online accuracy over labelled predictions", 100.0)}  # field: (help, percent → 1)


def metric_name(field: str) -> str:
    """The exported name of a status field (without ``_total``, which the client adds to counters)."""
    return f"ferret_{field}_ratio" if field in RATIOS else f"ferret_{field}"


class TrainerCollector(Collector):
    """Turns :class:`TrainerStatus` into metric families on every scrape."""

    def __init__(self, status: Callable[[], TrainerStatus], staleness: Callable[[], float | None]) -> None:
        self._status = status
        self._staleness = staleness

    def collect(self) -> Iterator[Metric]:
        s = self._status()
        for name, doc in COUNTERS.items():
            yield CounterMetricFamily(metric_name(name), doc, value=getattr(s, name))
        for name, doc in BY_REASON.items():
            family = CounterMetricFamily(metric_name(name), doc, labels=["reason"])
            for reason, value in sorted(getattr(s, name).items()):
                family.add_metric([str(reason)], value)
            yield family
        for name, doc in GAUGES.items():
            yield GaugeMetricFamily(metric_name(name), doc, value=getattr(s, name))
        for name, (doc, scale) in RATIOS.items():
            yield GaugeMetricFamily(metric_name(name), f"{doc} (0-1)", value=getattr(s, name) / scale)
        partitions = GaugeMetricFamily(
            "ferret_partition_lag_items",
            "Sample records behind the end of each assigned partition (-1: unknown)",
            labels=["partition"],
        )
        for partition, lag in sorted(s.lag_items_by_partition.items()):
            partitions.add_metric([str(partition)], lag)
        yield partitions
        if s.budget_bytes is not None:
            yield GaugeMetricFamily("ferret_budget_bytes", "The memory budget in force (absent: unconstrained)",
                                    value=s.budget_bytes)  # fmt: skip
        if s.planned_host_bytes:  # several hosts: the plan's bytes on each host (rank 0: the trainer's)
            per_host = GaugeMetricFamily(
                "ferret_planned_host_bytes", "Bytes the plan in force predicts each host holds (several hosts)",
                labels=["rank"],
            )
            for rank, value in enumerate(s.planned_host_bytes):
                per_host.add_metric([str(rank)], value)
            yield per_host
        state = GaugeMetricFamily("ferret_state", "The trainer's life-cycle state (1 for the current one)",
                                  labels=["state"])  # fmt: skip
        for value in TrainerState:
            state.add_metric([value.value], 1.0 if value is s.state else 0.0)
        yield state
        # several hosts: the predicting follower copies' lag, p50 / p99 / max as gauges labelled by `stat`
        # (not a summary: promtool keeps the `quantile` label for summaries)
        if s.freshness is not None:
            behind = GaugeMetricFamily(
                "ferret_prediction_freshness_updates",
                "Master updates the predicting copy was behind the newest master (several hosts)",
                labels=["stat"],
            )
            late = GaugeMetricFamily(
                "ferret_prediction_freshness_seconds",
                "Seconds since the first update the predicting copy lacked was announced (several hosts)",
                labels=["stat"],
            )
            for stat, n, ms in (
                ("p50", s.freshness.updates_p50, s.freshness.ms_p50),
                ("p99", s.freshness.updates_p99, s.freshness.ms_p99),
                ("max", float(s.freshness.updates_max), s.freshness.ms_max),
            ):
                behind.add_metric([stat], n)
                late.add_metric([stat], ms / 1000.0)
            yield behind
            yield late
        staleness = self._staleness()
        if staleness is not None:
            yield GaugeMetricFamily(
                "ferret_mean_staleness", "Mean staleness of applied gradients, in master updates", value=staleness
            )


class TrainerMetrics:
    """A private registry (no process-global state) with the histograms, built before the parts that
    observe them; :meth:`register` adds the collector of the trainer's status once it exists."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "ferret_prediction_latency_seconds",
            "Sample event time to prediction delivered (GetStatus latency_ms_p50/p99)",
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )
        self.replan_duration = Histogram(
            "ferret_replan_duration_seconds",
            "Re-plans through the control plane: planning plus applying the plan (drain, swap)",
            buckets=REPLAN_BUCKETS_S,
            registry=self.registry,
        )
        self.replan_stall = Histogram(
            "ferret_replan_stall_seconds",
            "Re-plans: how long the stream paused to apply the plan",
            buckets=REPLAN_BUCKETS_S,
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, process_cpu_seconds_total, …

    def observe_latency_ms(self, latency_ms: float) -> None:
        """The record path's latency (milliseconds, as the status keeps it), in seconds."""
        self.latency.observe(latency_ms / 1000.0)

    def observe_replan(self, outcome: ReplanOutcome) -> None:
        self.replan_duration.observe(outcome.seconds)
        self.replan_stall.observe(outcome.stall_seconds)

    def register(self, status: Callable[[], TrainerStatus], staleness: Callable[[], float | None]) -> None:
        self.registry.register(TrainerCollector(status, staleness))

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (``port=0`` picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
