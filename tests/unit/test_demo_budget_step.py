"""The demo's budget step: a cut when a smaller plan exists, else the control plane's refusal of an
infeasible budget, shown over real gRPC (against the control server with an in-memory trainer) and
reported plainly."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import grpc
import pytest

from ferret_core.errors import InfeasibleBudgetError
from services.control.client import ControlClient
from services.control.server import ControlServer, create_server
from services.demo.live_view import status_rows
from services.demo.options import BudgetStep, DemoOptions, budget_step
from services.demo.orchestrator import DemoRun
from services.demo.record import BudgetRefusal, PlanView, StatusPoint
from services.demo.report import build_summary, render_markdown, table_rows

from .control_fakes import MIN_BYTES, PLANNER, FakeTrainer


def test_a_cut_halfway_when_a_smaller_plan_exists() -> None:
    step = budget_step(1000, 3000)
    assert step == BudgetStep(2000, False, step.why) and "halfway" in step.why


def test_a_refusal_when_the_plan_in_force_is_the_smallest() -> None:
    step = budget_step(3000, 3000)
    assert step.refusal and step.budget == 1500 < 3000
    assert "no budget changes the plan" in step.why


def test_a_new_budget_given_is_taken_and_checked() -> None:
    assert budget_step(1000, 3000, new_budget=1200) == BudgetStep(1200, False, "--new-budget 1200 bytes")
    assert not budget_step(3000, 3000, new_budget=3000).refusal  # asked for: the plan as it is
    with pytest.raises(InfeasibleBudgetError, match="minimum feasible 1000"):
        budget_step(1000, 3000, new_budget=999)


@pytest.fixture
def smallest_plan_server() -> Iterator[ControlServer]:
    """A trainer whose plan in force is the planner's smallest (planned at its minimum feasible bytes)."""
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(MIN_BYTES)), max_watchers=1, unary_workers=2).start()
    yield server
    server.stop(grace_s=1.0)


def test_the_refusal_goes_through_grpc_and_leaves_the_plan(tmp_path: Path, smallest_plan_server: ControlServer) -> None:
    options = DemoOptions(dataset="digits", model="mlp", out_dir=tmp_path, topic_prefix="demo-x", items=100)
    run = DemoRun(options, view_stream=io.StringIO())
    with ControlClient(smallest_plan_server.target, timeout_s=10) as client:
        before_plan = PlanView.from_reply(client.get_plan())
        run.record.plan_before = before_plan
        assert before_plan.planned_bytes == before_plan.min_feasible_bytes == MIN_BYTES
        step = run._budget_step(before_plan)
        assert step.refusal and step.budget == MIN_BYTES // 2
        assert run.record.budget_step is not None and run.record.budget_step.startswith("refusal")
        point = StatusPoint.from_reply(client.get_status())
        future: Future[tuple[object, PlanView]] = Future()
        future.set_result(run._take_budget_step(client, step, point))
        run._budget_changed(future)  # type: ignore[arg-type]
        assert client.get_plan().plan_version == before_plan.version  # nothing was applied
    refusal = run.record.budget_refusal
    assert isinstance(refusal, BudgetRefusal) and run.record.budget_changes == [] and run.record.budget_step_done
    assert refusal.code == grpc.StatusCode.FAILED_PRECONDITION.name
    assert refusal.min_feasible_bytes == MIN_BYTES and refusal.to_bytes == MIN_BYTES // 2
    assert refusal.plan_version_before == refusal.plan_version_after and not refusal.plan_changed
    assert run.record.plan_after == before_plan

    run.record.timeline.append(point)
    assert "refused (FAILED_PRECONDITION" in dict(status_rows(run.record, "streaming"))["budget step"]
    summary = build_summary(run.record, None, files={})
    assert summary["budget_refusal"]["code"] == "FAILED_PRECONDITION" and summary["budget_changes"] == []
    assert summary["budget_step"] == run.record.budget_step
    row = dict(table_rows(summary))["budget step (no smaller plan exists)"]
    assert "refused: FAILED_PRECONDITION" in row and "unchanged" in row
    assert "budget step (no smaller plan exists)" in render_markdown(summary)


def test_a_step_expecting_a_refusal_records_an_accepted_budget_as_a_change(
    tmp_path: Path, smallest_plan_server: ControlServer
) -> None:
    options = DemoOptions(dataset="digits", model="mlp", out_dir=tmp_path, topic_prefix="demo-x", items=100)
    run = DemoRun(options, view_stream=io.StringIO())
    with ControlClient(smallest_plan_server.target, timeout_s=10) as client:
        run.record.plan_before = PlanView.from_reply(client.get_plan())
        point = StatusPoint.from_reply(client.get_status())
        change, after = run._take_budget_step(client, BudgetStep(MIN_BYTES, True, "x"), point)
    assert not isinstance(change, BudgetRefusal) and change.to_bytes == MIN_BYTES
    assert after.budget_bytes == MIN_BYTES
