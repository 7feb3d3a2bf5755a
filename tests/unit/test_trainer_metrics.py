"""The trainer's Prometheus endpoint, scraped over HTTP."""

from __future__ import annotations

import urllib.request

from services.control.trainer_port import TrainerStatus
from services.trainer.metrics import TrainerMetrics


def test_metrics_endpoint_reports_status_and_latency() -> None:
    status = TrainerStatus(
        items_valid=12,
        predictions_published=12,
        skipped={"busy": 3, "no_label": 1},
        dead_lettered={"non_finite": 2},
        budget_bytes=2000,
        online_accuracy=75.0,
        planned_bytes=1000,
        measured_bytes=900,
        lag_seconds=0.25,
    )
    metrics = TrainerMetrics()
    metrics.register(lambda: status, lambda: 1.5)
    metrics.latency.observe(7.0)
    port = metrics.serve(0)
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    expected = [
        "ferret_predictions_published_total 12.0",
        'ferret_skipped_total{reason="busy"} 3.0',
        'ferret_dead_lettered_total{reason="non_finite"} 2.0',
        "ferret_online_accuracy 75.0",
        "ferret_planned_bytes 1000.0",
        "ferret_measured_bytes 900.0",
        "ferret_budget_bytes 2000.0",
        "ferret_mean_staleness 1.5",
        'ferret_latency_ms_bucket{le="10.0"} 1.0',
    ]
    for line in expected:
        assert line in body, line


def test_every_metric_is_named_after_a_status_field() -> None:
    from dataclasses import fields

    from services.trainer.metrics import COUNTERS, GAUGES

    names = {f.name for f in fields(TrainerStatus)}
    assert set(COUNTERS) | set(GAUGES) | {"skipped", "dead_lettered", "budget_bytes"} <= names
