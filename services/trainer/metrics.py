"""Prometheus metrics of the trainer, read from its status at scrape time (nothing is counted twice).

Each metric is ``ferret_`` + the status field's name (counters get Prometheus' ``_total``): the same name
as in the counters, GetStatus (``services.control.trainer_port.TrainerStatus``) and snapshots."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.control.trainer_port import TrainerStatus

LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)

COUNTERS = {
    "items_received": "Sample records consumed",
    "items_valid": "Valid items (the trainer's counter i)",
    "items_dispatched": "Items dispatched to a pipeline worker",
    "predictions_published": "Predictions published",
    "duplicates_published": "Predictions re-emitted after a restart",
    "backward_passes": "Items back-propagated (any stage)",
    "labels_joined": "Late labels joined to their prediction",
    "labelled_predictions": "Predictions scored against a label (online accuracy's denominator)",
    "correct_predictions": "Predictions that were correct (online accuracy's numerator)",
    "replans": "Plans applied after start-up",
    "pauses": "Consumption pauses (re-planning, snapshots)",
}
GAUGES = {
    "online_accuracy": "Online accuracy over labelled predictions, percent",
    "planned_bytes": "Bytes the plan in force predicts",
    "measured_bytes": "Bytes the engine holds under the plan in force, measured peak",
    "lag_items": "Sample records consumed whose outcome is not durable yet",
    "lag_seconds": "Now minus the event time of the latest consumed sample",
    "plan_version": "Version of the plan in force",
    "model_version": "Optimizer updates applied to the master",
}


class TrainerCollector(Collector):
    """Turns :class:`TrainerStatus` into metric families on every scrape."""

    def __init__(self, status: Callable[[], TrainerStatus], staleness: Callable[[], float | None]) -> None:
        self._status = status
        self._staleness = staleness

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._status()
        for name, doc in COUNTERS.items():
            yield CounterMetricFamily(f"ferret_{name}", doc, value=getattr(s, name))
        for name, (doc, by_reason) in {
            "skipped": ("Items not trained, by reason", s.skipped),
            "dead_lettered": ("Records sent to the DLQ, by reason", s.dead_lettered),
        }.items():
            family = CounterMetricFamily(f"ferret_{name}", doc, labels=["reason"])
            for reason, value in by_reason.items():
                family.add_metric([str(reason)], value)
            yield family
        for name, doc in GAUGES.items():
            yield GaugeMetricFamily(f"ferret_{name}", doc, value=getattr(s, name))
        if s.budget_bytes is not None:
            yield GaugeMetricFamily("ferret_budget_bytes", "The memory budget in force", value=s.budget_bytes)
        staleness = self._staleness()
        if staleness is not None:
            yield GaugeMetricFamily("ferret_mean_staleness", "Mean staleness of applied gradients", value=staleness)


class TrainerMetrics:
    """A private registry (no process-global state) with the latency histogram, built before the record
    path that observes it; :meth:`register` adds the collector of the trainer's status once it exists."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.latency = Histogram(
            "ferret_latency_ms",
            "Sample event time to prediction delivered (ms); latency_ms_p50/p99 in GetStatus",
            buckets=LATENCY_BUCKETS_MS,
            registry=self.registry,
        )

    def register(self, status: Callable[[], TrainerStatus], staleness: Callable[[], float | None]) -> None:
        self.registry.register(TrainerCollector(status, staleness))

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (``port=0`` picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
