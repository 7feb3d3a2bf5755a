"""Prometheus metrics of the trainer, read from its status at scrape time (nothing is counted twice)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from services.control.trainer_port import TrainerStatus

LATENCY_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


class TrainerCollector(Collector):
    """Turns :class:`TrainerStatus` into metric families on every scrape."""

    def __init__(self, status: Callable[[], TrainerStatus], stats: Callable[[], dict[str, float]]) -> None:
        self._status = status
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._status()
        counters = {
            "ferret_items_received": ("Sample records consumed", s.items_received),
            "ferret_items_valid": ("Valid items (the trainer's counter i)", s.items_valid),
            "ferret_items_dispatched": ("Items dispatched to a pipeline worker", s.items_dispatched),
            "ferret_predictions_published": ("Predictions published", s.predictions_published),
            "ferret_predictions_duplicate": ("Predictions re-emitted after a restart", s.duplicates_published),
            "ferret_backward_passes": ("Items back-propagated (any stage)", s.backward_passes),
            "ferret_replans": ("Plans applied after start-up", s.replans),
            "ferret_pauses": ("Consumption pauses (re-planning, snapshots)", s.pauses),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(name, doc, value=value)
        skipped = CounterMetricFamily("ferret_items_skipped", "Items not trained, by reason", labels=["reason"])
        for reason, value in s.skipped_by_reason.items():
            skipped.add_metric([reason], value)
        yield skipped
        dlq = CounterMetricFamily("ferret_dead_lettered", "Records sent to the DLQ, by reason", labels=["reason"])
        for reason, value in s.dead_lettered_by_reason.items():
            dlq.add_metric([reason], value)
        yield dlq
        gauges = {
            "ferret_online_accuracy_percent": ("Online accuracy over labelled predictions", s.online_accuracy),
            "ferret_memory_planned_bytes": ("Bytes the plan predicts", s.planned_bytes),
            "ferret_memory_measured_bytes": ("Bytes the engine holds, measured", s.measured_bytes),
            "ferret_lag_seconds": ("Now minus the event time of the latest consumed sample", s.lag_seconds),
            "ferret_plan_version": ("Version of the plan in force", s.plan_version),
            "ferret_model_version": ("Optimizer updates applied to the master", s.model_version),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(name, doc, value=value)
        staleness = self._stats().get("mean_staleness")
        if staleness is not None:
            yield GaugeMetricFamily("ferret_mean_staleness", "Mean staleness of applied gradients", value=staleness)


class TrainerMetrics:
    """A private registry (no process-global state) with the collector and the latency histogram."""

    def __init__(self, status: Callable[[], TrainerStatus], stats: Callable[[], dict[str, float]]) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(TrainerCollector(status, stats))
        self.latency = Histogram(
            "ferret_prediction_latency_ms",
            "Sample event time to prediction published (ms)",
            buckets=LATENCY_BUCKETS_MS,
            registry=self.registry,
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Start the HTTP endpoint; returns the bound port (``port=0`` picks a free one)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return int(server.server_port)
