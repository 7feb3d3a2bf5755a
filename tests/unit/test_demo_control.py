"""The demo as a gRPC client (against the real control server on loopback with an in-memory trainer),
the producer-report parsing and the terminal view."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest

from services.control.client import ControlClient
from services.control.server import ControlServer, create_server
from services.demo.commands import delivered_count, serving_probe
from services.demo.live_view import LineView, make_view, plain_line, recent_rate, status_rows
from services.demo.options import DemoOptions
from services.demo.orchestrator import DemoRun
from services.demo.record import PlanView, StatusPoint
from services.localstack import free_port

from .control_fakes import FULL_BYTES, MIN_BYTES, PLANNER, FakeTrainer


@pytest.fixture
def control() -> Iterator[ControlServer]:
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(None)), max_watchers=1, unary_workers=2).start()
    yield server
    server.stop(grace_s=1.0)


@pytest.fixture
def client(control: ControlServer) -> Iterator[ControlClient]:
    with ControlClient(control.target, timeout_s=10) as c:
        yield c


def _run(tmp_path: Path) -> DemoRun:
    options = DemoOptions(dataset="digits", model="mlp", out_dir=tmp_path, topic_prefix="demo-x", items=100)
    return DemoRun(options, view_stream=io.StringIO())


def test_serving_probe_asks_the_health_service(control: ControlServer) -> None:
    probe, close = serving_probe(control.target)
    try:
        assert probe()
        control.health.set_ready(False)
        assert not probe()
    finally:
        close()


def test_serving_probe_is_false_while_nothing_listens() -> None:
    probe, close = serving_probe(f"127.0.0.1:{free_port()}")
    try:
        assert not probe()
    finally:
        close()


def test_plan_and_status_replies_are_recorded(client: ControlClient) -> None:
    plan = PlanView.from_reply(client.get_plan())
    assert plan.version == 1 and plan.budget_bytes is None
    assert plan.planned_bytes == FULL_BYTES and plan.min_feasible_bytes == MIN_BYTES
    assert plan.plan == PLANNER.plan(None).to_dict()  # the `ferret plan --json` document
    point = StatusPoint.from_reply(client.get_status())
    assert point.state == "running" and point.budget_bytes is None
    assert point.skipped == {"busy": 2, "no_label": 1} and point.dead_lettered == 1
    assert point.outcomes == point.predictions_published + point.dead_lettered


def test_budget_change_goes_through_grpc_and_records_the_reply(tmp_path: Path, client: ControlClient) -> None:
    run = _run(tmp_path)
    run.record.plan_before = PlanView.from_reply(client.get_plan())
    step = run._budget_step(run.record.plan_before)
    budget = step.budget
    assert budget == (MIN_BYTES + FULL_BYTES) // 2 and not step.refusal
    before = StatusPoint.from_reply(client.get_status())
    change, after = run._change_budget(client, budget, before)
    assert change.from_bytes is None and change.to_bytes == budget
    assert (change.plan_version_before, change.plan_version_after) == (1, 2)
    assert change.plan_changed and after.planned_bytes <= budget
    assert change.planned_bytes_after == after.planned_bytes < change.planned_bytes_before
    assert change.stall_seconds == pytest.approx(0.001) and change.planning_seconds > 0
    assert change.applied_time_ms >= change.requested_time_ms
    assert client.get_plan().plan_version == 2


def test_an_infeasible_new_budget_is_refused_before_streaming(tmp_path: Path, client: ControlClient) -> None:
    from dataclasses import replace

    from ferret_core.errors import InfeasibleBudgetError

    run = _run(tmp_path)
    run.options = replace(run.options, new_budget=MIN_BYTES - 1)
    with pytest.raises(InfeasibleBudgetError, match=str(MIN_BYTES)):
        run._budget_step(PlanView.from_reply(client.get_plan()))


def test_delivered_count_reads_the_producers_last_report(tmp_path: Path) -> None:
    log = tmp_path / "producer.log"
    assert delivered_count(log) is None
    log.write_text("$ ferret produce\nproducing digits (300 items)\n")
    assert delivered_count(log) is None
    log.write_text(
        "producing digits\nproduced 300 samples to x.samples: delivered 298, failed 2 in 6.01 s (50 items/s)\n"
    )
    assert delivered_count(log) == 298


def test_view_rows_and_lines(tmp_path: Path, client: ControlClient) -> None:
    run = _run(tmp_path)
    record = run.record
    assert status_rows(record, "starting") == [("phase", "starting")]
    assert plain_line(record, "starting") == "[demo] starting"
    record.timeline += [StatusPoint.from_reply(client.get_status()) for _ in range(3)]
    rows = dict(status_rows(record, "streaming"))
    assert rows["budget"] == "unconstrained" and rows["predictions"] == "29"
    assert rows["trained / skipped"].endswith("busy 7, no_label 1")
    line = plain_line(record, "streaming")
    assert line.startswith("[demo] streaming: consumed 30 predicted 29") and "plan v1" in line


def test_recent_rate_uses_the_last_seconds(tmp_path: Path) -> None:
    def point(t: int, n: int) -> StatusPoint:
        return StatusPoint(
            time_ms=t, state="running", items_received=n, items_valid=n, predictions_published=n, dead_lettered=0,
            dispatched=n, backward_passes=n, skipped={}, online_accuracy=0.0, budget_bytes=None, planned_bytes=0,
            measured_bytes=0, lag_items=0, lag_seconds=0.0, items_per_second=0.0, latency_ms_p50=0.0,
            latency_ms_p99=0.0, plan_version=1, replans=0, pauses=0, last_snapshot_version=0,
        )  # fmt: skip

    assert recent_rate([point(0, 0)]) is None
    timeline = [point(0, 0), point(1000, 100), point(2000, 150), point(4000, 250)]
    assert recent_rate(timeline, window_ms=3000) == pytest.approx((250 - 100) / 3)
    assert recent_rate(timeline, window_ms=500) == pytest.approx((250 - 150) / 2)  # at least two points


def test_without_a_terminal_the_view_prints_plain_lines(tmp_path: Path) -> None:
    stream = io.StringIO()
    view = make_view(live=True, stream=stream)
    assert isinstance(view, LineView)
    record = _run(tmp_path).record
    with view:
        view.update(record, "starting")
        view.update(record, "starting")  # same phase within the interval: throttled
        view.update(record, "streaming")
    assert stream.getvalue().splitlines() == ["[demo] starting", "[demo] streaming"]


def test_last_log_line_names_the_failure(tmp_path: Path) -> None:
    from services.demo.commands import last_log_line

    log = tmp_path / "trainer.log"
    assert last_log_line(log) == ""
    log.write_text("Traceback (most recent call last):\n  File x\nTypeError: bad argument\n\n")
    assert last_log_line(log) == ": TypeError: bad argument"
    log.write_text("ferret: error: missing IDX files\n")
    assert last_log_line(log) == ": missing IDX files"
