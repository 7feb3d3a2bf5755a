"""The demo's live plain consumer (``services/demo/plain_phase.py``) without a broker: its command line,
reading its JSON line, and how its result lands in summary.json, report.md and the plot. The run itself
(a real consumer on the embedded broker) is ``tests/integration/test_demo_e2e.py``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from services.demo.options import DemoOptions
from services.demo.plain_phase import PlainConsumerResult, parse_result, plain_consumer_command, plain_prefix
from services.demo.report import build_summary, table_rows, write_report
from services.plain_consumer.consumer import main as consumer_main
from tests.unit.test_demo_report import outcome, run_record, stream

LINE = {
    "items": 4,
    "labelled": 4,
    "trained": 3,
    "correct": 3,
    "latencies_ms": [10.0, 12.0, 14.0, 100.0],
    "per_item": {"0": [1, 1, 0]},
    "cpu_s": 0.5,
    "span_s": 0.2,
    "timeline": [[1000, 1], [1500, 0], [2000, 1], [3000, 1]],
}


def options(tmp_path: Path, **kw: object) -> DemoOptions:
    return DemoOptions(dataset="digits", model="mlp", out_dir=tmp_path, topic_prefix="demo-x", items=300, rate=50.0,
                       **kw)  # type: ignore[arg-type]  # fmt: skip


def test_the_consumer_reads_its_own_topics_for_the_same_items(tmp_path: Path) -> None:
    argv = plain_consumer_command(options(tmp_path), "127.0.0.1:9092", python="py")
    assert argv[:3] == ["py", "-m", "services.plain_consumer"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert flags["--prefix"] == plain_prefix(options(tmp_path)) == "demo-x-plain"
    assert (flags["--dataset"], flags["--model"], flags["--items"]) == ("digits", "mlp", "300")
    assert float(flags["--timeout-s"]) >= 300 / 50  # the stream's own length, and slack
    assert argv[-1] == "--timeline"
    # the consumer accepts every flag the demo passes (argparse exits 2 on an unknown one)
    with pytest.raises(SystemExit) as exited:
        consumer_main([*argv[3:], "--help"])
    assert exited.value.code == 0


def test_its_json_line_is_read_after_the_log_lines_and_gives_the_running_accuracy() -> None:
    result = parse_result("READY\nsome log line\n" + json.dumps(LINE) + "\n")
    assert result.error is None
    assert (result.items, result.labelled, result.trained, result.correct) == (4, 4, 3, 3)
    assert result.accuracy == pytest.approx(75.0)
    assert result.seconds == (0.0, 0.5, 1.0, 2.0)
    assert result.running == pytest.approx((100.0, 50.0, 200 / 3, 75.0))
    assert result.latency_ms_p50 is not None and result.latency_ms_p99 is not None
    assert result.latency_ms_p50 <= result.latency_ms_p99 <= 100.0


def test_no_result_line_is_an_error_not_a_number() -> None:
    result = parse_result("READY\nTraceback (most recent call last):\n  boom\n")
    assert result.error == "the plain consumer printed no result line" and result.accuracy is None


def test_the_summary_report_and_plot_show_it_beside_ferret(tmp_path: Path) -> None:
    plain = parse_result(json.dumps(LINE))
    summary = write_report(tmp_path, run_record(tmp_path), outcome(stream(100)), None, plain)
    assert summary["plain_consumer"]["online_accuracy"] == pytest.approx(75.0)
    assert summary["plain_consumer"]["trained"] == 3 and summary["plain_consumer"]["error"] is None
    assert summary["plain_consumer"]["how"].startswith("live")
    row = dict(table_rows(summary))["plain consumer, same items and rate (live, after Ferret)"]
    assert row.startswith("online accuracy 75.0") and "trained 3 of 4" in row
    assert Path(summary["files"]["plot"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((tmp_path / "summary.json").read_text()) == summary


def test_a_failed_consumer_is_reported_and_an_absent_one_is_null(tmp_path: Path) -> None:
    failed = build_summary(run_record(tmp_path), outcome(stream(10)), {}, None, PlainConsumerResult(error="boom"))
    assert failed["plain_consumer"]["error"] == "boom" and failed["plain_consumer"]["online_accuracy"] is None
    assert dict(table_rows(failed))["plain consumer, same items and rate (live, after Ferret)"] == "no result: boom"
    assert build_summary(run_record(tmp_path), outcome(stream(10)), {})["plain_consumer"] is None
