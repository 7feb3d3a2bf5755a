"""A plan made for several hosts over the control plane: GetPlan carries its bytes per host (typed and in the
plan's JSON), `ferret control plan` prints them, and a per-host budget no plan fits is FAILED_PRECONDITION."""

from __future__ import annotations

import json
from pathlib import Path

import grpc

from ferret_core.errors import InfeasibleHostBudgetError
from ferret_core.planning.host_memory import HostBudget
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from services.cli.control_cmd import format_plan_reply
from services.control.messages import plan_from_reply, plan_reply
from services.control.servicer import status_for

PROFILE = Path(__file__).resolve().parents[2] / "benchmarks/profiles/mnistnet-batches.json"


def test_get_plan_carries_and_prints_the_bytes_per_host() -> None:
    profile = ModelProfile.from_dict(json.loads(PROFILE.read_text()))
    settings = PlannerSettings(memory=MemorySettings(executors="processes"), hosts=HostBudget(2))
    plan = Planner(profile, settings).plan()
    reply = plan_reply(plan, 3)
    assert list(reply.host_bytes) == list(plan.host_bytes) and len(plan.host_bytes) == 2
    assert plan_from_reply(reply).host_bytes == plan.host_bytes
    assert "planned bytes per host: rank 0 " in format_plan_reply(reply)
    one_host = plan_reply(Planner(profile, PlannerSettings()).plan(), 1)
    assert list(one_host.host_bytes) == [] and "per host" not in format_plan_reply(one_host)


def test_a_per_host_budget_no_plan_fits_is_failed_precondition() -> None:
    code, details = status_for(InfeasibleHostBudgetError(1000, 2, 5000))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "at least 5000" in details
