"""The demo's report from synthetic predictions: statistics, the accuracy curve, summary.json, report.md
and the PNG."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from services.demo.accuracy_curve import accuracy_curve
from services.demo.collect import Outcome, PredictionRecord, distinct_in_time_order
from services.demo.record import BudgetChange, PlanView, RunRecord, StatusPoint
from services.demo.report import (
    build_summary,
    prediction_stats,
    render_markdown,
    table_rows,
    write_report,
)
from services.kafka.admin import TopicCount

T0 = 1_800_000_000_000  # ms since the epoch


def prediction(
    i: int, *, correct: bool = True, duplicate: bool = False, latency: float = 10.0, **kw: object
) -> PredictionRecord:
    values: dict[str, object] = {
        "sample_id": f"digits/{i}",
        "item": i,
        "has_label": True,
        "correct": correct,
        "online_accuracy": 0.0,
        "latency_ms": latency,
        "duplicate": duplicate,
        "decision": "dispatched",
        "plan_version": 1,
        "model_version": i,
        "predicted_time_ms": T0 + 20 * i,
    }
    values.update(kw)
    return PredictionRecord(**values)  # type: ignore[arg-type]


def stream(n: int = 100) -> list[PredictionRecord]:
    """n predictions 20 ms apart; every third one wrong; latencies 1..n ms; the second half on plan v2."""
    return [
        prediction(
            i,
            correct=i % 3 != 0,
            latency=float(i + 1),
            plan_version=1 if i < n // 2 else 2,
            decision="busy" if i % 10 == 0 else "dispatched",
        )
        for i in range(n)
    ]


def plan_view(version: int, budget: int | None, predicted: int) -> PlanView:
    plan = {"model": "mlp", "num_stages": 2, "num_workers": 2, "live_workers": 2 if budget is None else 1}
    return PlanView(plan=plan, version=version, budget_bytes=budget, planned_bytes=predicted, min_feasible_bytes=1000)


def status(**kw: object) -> StatusPoint:
    values: dict[str, object] = dict(
        time_ms=T0 + 2000, state="running", items_received=100, items_valid=100, predictions_published=100,
        dead_lettered=0, dispatched=90, backward_passes=180, skipped={"busy": 10}, online_accuracy=66.0,
        budget_bytes=3000, planned_bytes=2500, measured_bytes=2400, lag_items=0, lag_seconds=0.0,
        items_per_second=48.0, latency_ms_p50=50.0, latency_ms_p99=99.0, plan_version=2, replans=1, pauses=3,
        last_snapshot_version=4,
    )  # fmt: skip
    values.update(kw)
    return StatusPoint(**values)  # type: ignore[arg-type]


def run_record(tmp_path: Path) -> RunRecord:
    record = RunRecord(
        dataset="digits", model="mlp", profile=None, items_requested=100, rate=50.0, topic_prefix="demo-x",
        out_dir=tmp_path, started_time_ms=T0 - 5000, items_produced=100, trainer_exit_code=0, producer_exit_code=0,
    )  # fmt: skip
    record.plan_before = plan_view(1, None, 5000)
    record.plan_after = plan_view(2, 3000, 2500)
    record.budget_changes.append(
        BudgetChange(
            requested_time_ms=T0 + 990,
            applied_time_ms=T0 + 1000,
            from_bytes=None,
            to_bytes=3000,
            planning_seconds=0.002,
            stall_seconds=0.01,
            call_seconds=0.02,
            predictions_before=50,
            plan_version_before=1,
            plan_version_after=2,
            planned_bytes_before=5000,
            planned_bytes_after=2500,
            plan_changed=True,
        )
    )
    record.timeline += [
        status(time_ms=T0 + 500, budget_bytes=None, planned_bytes=5000, measured_bytes=4000, plan_version=1),
        status(),
    ]
    record.snapshot_requested = {"version": 4, "total_bytes": 4577, "chunks": 1, "seconds": 0.01}
    record.snapshots_stored = [{"version": 5, "valid": True}, {"version": 4, "valid": True}]
    record.measured_bytes_before_change = 4000
    record.ended_time_ms = T0 + 15000
    record.complete = True
    return record


def outcome(records: list[PredictionRecord]) -> Outcome:
    distinct = len({r.sample_id for r in records})
    return Outcome(
        predictions=records,
        predictions_count=TopicCount("demo-x.predictions", records=len(records), distinct=distinct),
        samples_count=TopicCount("demo-x.samples", records=100, distinct=100),
        dlq_count=TopicCount("demo-x.samples.dlq", records=0, distinct=0),
    )


def test_stats_count_each_sample_once_preferring_the_original() -> None:
    records = [*stream(10), prediction(3, correct=True, duplicate=True, predicted_time_ms=T0 + 9999)]
    kept = distinct_in_time_order(records)
    assert [r.item for r in kept] == list(range(10))
    assert not any(r.duplicate for r in kept)
    stats = prediction_stats(records)
    assert (stats.distinct, stats.records, stats.labelled) == (10, 11, 10)
    assert stats.correct == 6  # items 0, 3, 6, 9 wrong; the duplicate of 3 does not count


def test_stats_latency_quantiles_throughput_and_decisions() -> None:
    records = stream(100)
    stats = prediction_stats(records)
    latencies = np.arange(1, 101, dtype=float)
    assert stats.latency_ms_p50 == pytest.approx(np.quantile(latencies, 0.5))
    assert stats.latency_ms_p99 == pytest.approx(np.quantile(latencies, 0.99))
    assert stats.latency_ms_max == 100.0
    assert stats.span_s == pytest.approx(99 * 0.02)
    assert stats.throughput == pytest.approx(50.0)  # one every 20 ms
    assert stats.decisions == {"busy": 10, "dispatched": 90}
    assert stats.accuracy == pytest.approx(100 * 66 / 100)


def test_stats_of_nothing() -> None:
    stats = prediction_stats([])
    assert stats.distinct == 0 and stats.accuracy is None and stats.throughput is None
    assert stats.latency_ms_p50 is None


def test_unlabelled_predictions_do_not_count_for_accuracy() -> None:
    records = [prediction(0, correct=False, has_label=False), prediction(1), prediction(2, correct=False)]
    stats = prediction_stats(records)
    assert (stats.labelled, stats.correct, stats.accuracy) == (2, 1, 50.0)


def test_accuracy_curve_is_running_and_windowed_over_time() -> None:
    records = [prediction(i, correct=c) for i, c in enumerate([True, False, True, True])]
    curve = accuracy_curve(list(reversed(records)), window=2)  # read-back order does not matter
    assert curve.seconds == pytest.approx([0.0, 0.02, 0.04, 0.06])
    assert curve.running == pytest.approx([100.0, 50.0, 200 / 3, 75.0])
    assert curve.windowed == pytest.approx([100.0, 50.0, 50.0, 100.0])


def test_summary_has_the_contract_keys(tmp_path: Path) -> None:
    summary = build_summary(run_record(tmp_path), outcome(stream(100)), files={})
    required = {
        "items_produced", "predictions_published", "predictions_counted_from_topic", "dlq", "online_accuracy",
        "trained", "skipped", "budget_changes", "snapshots", "plans", "planned_bytes", "measured_peak_bytes",
        "throughput_items_per_s", "latency_ms_p50", "latency_ms_p99", "dataset", "model", "rate", "duration_s",
    }  # fmt: skip
    assert required <= summary.keys()
    assert summary["ok"] and summary["complete"]
    assert summary["items_produced"] == summary["predictions_counted_from_topic"] == 100
    assert summary["predictions_published"] == 100 and summary["trained"] == 90
    assert summary["skipped"] == {"busy": 10}
    assert summary["plans"]["before"]["live_workers"] == 2 and summary["plans"]["after"]["live_workers"] == 1
    assert (summary["planned_bytes_before"], summary["planned_bytes"]) == (5000, 2500)
    assert (summary["measured_peak_bytes_before_change"], summary["measured_peak_bytes"]) == (4000, 2400)
    assert summary["duration_s"] == pytest.approx(20.0)
    assert summary["snapshots"]["written"] == 5 and len(summary["snapshots"]["in_redis"]) == 2
    [change] = summary["budget_changes"]
    assert (change["from"], change["to"], change["stall_seconds"]) == (None, 3000, 0.01)
    assert change["time_s"] == pytest.approx(1.0)  # after the first prediction
    assert change["planning_seconds"] == 0.002 and change["plan_changed"]
    json.dumps(summary)  # serialisable as is


def test_summary_of_a_failed_run_without_read_back(tmp_path: Path) -> None:
    record = RunRecord(
        dataset="mnist", model="mnistnet", profile="p.json", items_requested=10, rate=5.0, topic_prefix="demo-y",
        out_dir=tmp_path, started_time_ms=T0, error="the trainer exited with status 1 before it was ready",
    )  # fmt: skip
    summary = build_summary(record, None, files={})
    assert not summary["ok"] and not summary["complete"]
    assert summary["predictions_counted_from_topic"] is None and summary["budget_changes"] == []
    rows = dict(table_rows(summary))
    assert rows["items produced"] == "n/a" and rows["budget"] == "unconstrained → unconstrained"
    assert "FAILED: the trainer exited" in render_markdown(summary)


def test_table_and_markdown(tmp_path: Path) -> None:
    summary = build_summary(run_record(tmp_path), outcome(stream(100)), files={"plot": str(tmp_path / "x.png")})
    rows = dict(table_rows(summary))
    assert rows["predictions on topic (read back, distinct)"] == "100"
    assert rows["latency p50 / p99"] == "50.5 ms / 99.0 ms"
    assert rows["budget"] == "unconstrained → 2.93 KiB"
    assert "plan v1 → v2" in rows["budget change"] and "stall 10.0 ms" in rows["budget change"]
    markdown = render_markdown(summary)
    assert "| predictions published (trainer) | 100 |" in markdown
    assert "![online accuracy](x.png)" in markdown


def test_write_report_writes_every_file(tmp_path: Path) -> None:
    summary = write_report(tmp_path, run_record(tmp_path), outcome(stream(200)))
    for key in ("summary", "report", "timeline", "plot"):
        assert Path(summary["files"][key]).is_file(), key
    assert Path(summary["files"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary
    assert len(json.loads((tmp_path / "timeline.json").read_text())) == 2


def test_write_report_without_predictions_has_no_plot(tmp_path: Path) -> None:
    summary = write_report(tmp_path, run_record(tmp_path), None)
    assert "plot" not in summary["files"] and not (tmp_path / "online_accuracy.png").exists()


def test_steady_latency_leaves_out_the_start_up_backlog() -> None:
    # items 0-4 waited in the topic while the trainer joined its group: produced before the first prediction
    backlog = [prediction(i, latency=3000.0 - 20 * i) for i in range(5)]
    steady = [prediction(i, latency=5.0) for i in range(5, 100)]
    stats = prediction_stats(backlog + steady)
    assert stats.latency_ms_p99 is not None and stats.latency_ms_p99 > 2000
    assert stats.latency_ms_p50_steady == stats.latency_ms_p99_steady == 5.0
