"""The wall clock's admission queue (K × (input + label) per live worker, docs/planner.md reading 7b) is in
the planned bytes of every live method that admits through it, once: the planner's plans (Ferret), hand
plans, the pipeline schedules' own plans and 1-Skip's; not in Oracle's (unbounded by design) nor the
buffering methods' (their window holds what waits). And measured ≤ planned with the queue full."""

from __future__ import annotations

import math

import pytest
import torch

from ferret_core.engine import METHOD_NAMES
from ferret_core.planning.admission_queue import AdmissionQueue
from ferret_core.planning.memory_model import MemorySettings, admission_queue_bytes
from ferret_core.planning.planner import Planner, PlannerSettings
from services.config import load_settings
from services.trainer.engine_learner import EngineLearner
from services.trainer.live_methods import DELIVERY_ITEMS, DELIVERY_SPREAD_S, live_setup
from services.trainer.runner import build_zoo_model, load_profile, make_planner
from tests.unit.test_engine_policies import tiny_profile
from tests.unit.test_engine_support import make_plan

QUEUED = ("ferret", "1-skip", "dapple", "zb", "hanayo-1w", "hanayo-2w", "hanayo-3w", "pipedream", "pipedream-2bw")
UNQUEUED = ("oracle", "random-n", "last-n", "camel")


def test_every_method_is_classified() -> None:
    assert set(QUEUED) | set(UNQUEUED) == set(METHOD_NAMES)


def planner_plan(arrival_interval: float = 0.5):  # type: ignore[no-untyped-def]
    """The trainer's kind of plan: the planner counts the queue (K for its own N and t^d)."""
    memory = MemorySettings(compensator="none", admission_queue=AdmissionQueue(DELIVERY_SPREAD_S, DELIVERY_ITEMS))
    settings = PlannerSettings(arrival_interval=arrival_interval, memory=memory, max_workers=2)
    return Planner(tiny_profile(), settings).plan(None)


@pytest.mark.parametrize("method", QUEUED)
def test_queued_methods_count_the_queue_the_wall_clock_enforces(method: str) -> None:
    plan = planner_plan()
    setup, admission = live_setup(method, plan, "tiny", 3, profile=tiny_profile())
    assert admission is not None and setup.planned is not None
    live = sum(1 for w in setup.plan.workers if w.live)
    expected = admission_queue_bytes(tiny_profile(), admission.queue_slots, live)
    assert expected == admission.queue_slots * live * (6 + 2) * 4  # 6 inputs + an int64 label, float32
    assert setup.planned.memory_breakdown["admission_queue"] == expected, method
    assert setup.planned.planned_bytes == sum(setup.planned.memory_breakdown.values()), method
    if method == "ferret":  # the planner counted it: not twice
        assert setup.planned.planned_bytes == plan.planned_bytes
    if method == "1-skip":  # W = 0: K is one delivery's share (or what reaches it in D)
        assert admission.max_wait_s == 0.0 and admission.queue_slots == DELIVERY_ITEMS


@pytest.mark.parametrize("method", ["dapple", "zb", "hanayo-2w", "pipedream", "pipedream-2bw"])
def test_a_schedules_executed_plan_reports_the_same_bytes(method: str) -> None:
    """GetPlan reports the executed plan (``learner.plan``); the status the planned one: the same bytes."""
    setup, _ = live_setup(method, planner_plan(), "tiny", 3, profile=tiny_profile())
    assert setup.planned is not None and setup.plan.planned_bytes == setup.planned.planned_bytes


def test_a_hand_plan_counts_the_queue_too() -> None:
    plan = make_plan(3, 2, num_units=3)  # no planner: no queue in its bytes
    assert "admission_queue" not in plan.memory_breakdown
    setup, admission = live_setup("ferret", plan, "tiny", 3, profile=tiny_profile())
    assert admission is not None and setup.planned is not None
    queue = admission_queue_bytes(tiny_profile(), admission.queue_slots, 2)
    assert setup.planned.planned_bytes == plan.planned_bytes + queue
    assert setup.plan.partition == plan.partition and setup.plan.workers == plan.workers


@pytest.mark.parametrize("method", UNQUEUED)
def test_unqueued_methods_leave_it_out(method: str) -> None:
    setup, _ = live_setup(method, planner_plan(), "tiny", 3, profile=tiny_profile())
    assert setup.planned is not None and "admission_queue" not in setup.planned.memory_breakdown


def test_without_a_profile_nothing_is_planned_or_added() -> None:
    setup, _ = live_setup("1-skip", planner_plan(), "tiny", 3)
    assert setup.planned is None


@pytest.mark.parametrize("method", ["1-skip", "pipedream"])
def test_measured_peak_stays_within_planned_with_the_queue_full(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backlog delivered at once, stamped 1 s apart: by event time every item finds its worker free, so
    they all wait in the queue up to K; the meter counts them, and the plan does too. (The real queue's
    bound ⌊(W + H)/s⌋ is lifted here, H = ∞, so the queue can reach the K the plan counts.)"""
    monkeypatch.setattr("services.trainer.live_methods.START_HORIZON_S", math.inf)
    env = {"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp", "FERRET_TRAINER_METHOD": method}
    settings = load_settings(None, env={**env, "FERRET_TRAINER_STREAM_RATE": "50"})
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    learner = EngineLearner(model, make_planner(settings, profile).plan(None), settings, profile)
    gen = torch.Generator().manual_seed(0)
    try:
        futures = [learner.submit(i, torch.rand(64, generator=gen), i % 10, event_time_ms=1000 * i) for i in range(400)]
        outcomes = [f().skipped for f in futures]
        learner.drain(120)
        stats = learner.stats()
    finally:
        learner.close()
    assert learner.admission is not None
    assert sum(o is None for o in outcomes) >= learner.admission.queue_slots  # the queue filled
    assert stats.planned_bytes is not None
    assert 0 < stats.peak_bytes <= stats.planned_bytes
    assert "admission_queue" in learner.engine.planned.memory_breakdown  # type: ignore[union-attr]
