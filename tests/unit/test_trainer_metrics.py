"""The trainer's Prometheus endpoint, scraped over HTTP: names by Prometheus' conventions (base units,
ratios 0–1, ``_total`` counters; ``promtool check metrics`` where promtool is installed), values from the
status, the latency and re-plan histograms. A live trainer's endpoint: tests/integration/test_downstream.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from dataclasses import fields
from pathlib import Path

import pytest

from ferret_core.engine.processes.hosts import Freshness
from ferret_core.planning.planner import Planner
from services.control.replanner import Replanner
from services.control.trainer_port import TrainerState, TrainerStatus
from services.trainer.metrics import BY_REASON, COUNTERS, GAUGES, RATIOS, TrainerMetrics

from .control_fakes import FakeTrainer
from .planner_fixtures import golden_a

FULL = TrainerStatus(
    state=TrainerState.REPLANNING,
    items_received=14,
    items_valid=12,
    predictions_published=12,
    skipped={"busy": 3, "no_label": 1},
    dead_lettered={"non_finite": 2},
    budget_bytes=2000,
    online_accuracy=75.0,
    planned_bytes=1000,
    measured_bytes=900,
    lag_items=5,
    lag_seconds=0.25,
    lag_items_by_partition={0: 2, 1: 3},
    replans=1,
    freshness=Freshness(
        predictions=40, updates_p50=1.0, updates_p99=3.0, updates_max=4, ms_p50=5.0, ms_p99=20.0, ms_max=25.0
    ),
    planned_host_bytes=(300, 700),
)


def promtool() -> str | None:
    local = Path(sys.executable).parent / "promtool"
    return str(local) if local.is_file() else shutil.which("promtool")


def promtool_check(exposition: str) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` of an exposition (skips, saying how to get promtool, when it is missing)."""
    binary = promtool()
    if binary is None:
        pytest.skip("promtool is not installed (scripts/test.sh takes it from the platform's prometheus package)")
    return subprocess.run(
        [binary, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=60, check=False
    )


def scrape(metrics: TrainerMetrics) -> str:
    port = metrics.serve(0)
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def test_metrics_endpoint_reports_status_and_histograms_in_base_units() -> None:
    metrics = TrainerMetrics()
    metrics.register(lambda: FULL, lambda: 1.5)
    metrics.observe_latency_ms(7.0)
    body = scrape(metrics)
    expected = [
        "ferret_items_received_total 14.0",
        "ferret_predictions_published_total 12.0",
        "ferret_replans_total 1.0",
        'ferret_skipped_total{reason="busy"} 3.0',
        'ferret_dead_lettered_total{reason="non_finite"} 2.0',
        "ferret_online_accuracy_ratio 0.75",
        "ferret_planned_bytes 1000.0",
        "ferret_measured_bytes 900.0",
        "ferret_budget_bytes 2000.0",
        "ferret_lag_items 5.0",
        'ferret_partition_lag_items{partition="1"} 3.0',
        "ferret_mean_staleness 1.5",
        'ferret_prediction_freshness_updates{stat="p99"} 3.0',
        'ferret_prediction_freshness_seconds{stat="p99"} 0.02',
        'ferret_prediction_freshness_updates{stat="max"} 4.0',
        'ferret_planned_host_bytes{rank="0"} 300.0',
        'ferret_planned_host_bytes{rank="1"} 700.0',
        'ferret_state{state="replanning"} 1.0',
        'ferret_state{state="running"} 0.0',
        'ferret_prediction_latency_seconds_bucket{le="0.005"} 0.0',
        'ferret_prediction_latency_seconds_bucket{le="0.01"} 1.0',
        "ferret_prediction_latency_seconds_sum 0.007",
        "ferret_replan_duration_seconds_count 0.0",
        "# TYPE process_resident_memory_bytes gauge",
    ]
    for line in expected:
        assert line in body, line
    for old in ("ferret_latency_ms", "ferret_online_accuracy ", "ferret_skipped{"):
        assert old not in body, old
    unconstrained = TrainerMetrics()
    unconstrained.register(lambda: TrainerStatus(), lambda: None)
    body = scrape(unconstrained)
    assert "ferret_budget_bytes" not in body and "ferret_mean_staleness" not in body
    assert "ferret_prediction_freshness" not in body  # one host: predictions read the master itself


def test_every_metric_is_named_after_a_status_field() -> None:
    names = {f.name for f in fields(TrainerStatus)}
    assert set(COUNTERS) | set(BY_REASON) | set(GAUGES) | set(RATIOS) | {"budget_bytes"} <= names


def test_every_applied_replan_is_observed_and_a_failing_listener_does_not_fail_it() -> None:
    metrics = TrainerMetrics()
    planner = Planner(golden_a())
    trainer = FakeTrainer(planner.plan(None), stall_seconds=0.02)
    replanner = Replanner(planner, trainer, on_applied=metrics.observe_replan)
    outcome = replanner.request(planner.plan(None).planned_bytes)
    assert outcome.seconds >= outcome.planning_seconds and outcome.stall_seconds == 0.02
    duration = {s.name: s.value for s in metrics.replan_duration.collect()[0].samples if not s.labels}
    stall = {s.name: s.value for s in metrics.replan_stall.collect()[0].samples if not s.labels}
    assert duration["ferret_replan_duration_seconds_count"] == 1
    assert duration["ferret_replan_duration_seconds_sum"] == pytest.approx(outcome.seconds)
    assert stall["ferret_replan_stall_seconds_sum"] == pytest.approx(0.02)
    replanner.close()

    def broken(_: object) -> None:
        raise RuntimeError("listener")

    failing = Replanner(planner, trainer, on_applied=broken)
    assert failing.request(planner.plan(None).planned_bytes).version == 3  # applied, and the call succeeds
    failing.close()


def test_promtool_finds_nothing_to_complain_about() -> None:
    metrics = TrainerMetrics()
    metrics.register(lambda: FULL, lambda: 1.5)
    metrics.observe_latency_ms(12.0)
    metrics.replan_duration.observe(0.3)
    out = promtool_check(scrape(metrics))
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


def test_promtool_would_catch_the_old_names() -> None:
    """The check above can fail: the old names (in milliseconds) do not pass."""
    old = (
        "# HELP ferret_latency_ms Sample event time to prediction delivered (ms)\n"
        "# TYPE ferret_latency_ms histogram\n"
        'ferret_latency_ms_bucket{le="+Inf"} 1.0\nferret_latency_ms_count 1.0\nferret_latency_ms_sum 7.0\n'
    )
    out = promtool_check(old)
    assert out.returncode != 0 and "ferret_latency_ms metric names should not contain abbreviated units" in out.stderr
