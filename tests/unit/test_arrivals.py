"""The measured arrival interval and re-planning on drift (DESIGN §4)."""

from __future__ import annotations

import threading

import pytest

from ferret_core.errors import ConfigError
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from services.control.replanner import Replanner, ReplanOutcome
from services.trainer.arrivals import ArrivalRate, DriftReplanner, SwitchablePlanner

from .control_fakes import FakeTrainer
from .planner_fixtures import golden_a


def test_interval_from_event_times_with_ewma() -> None:
    rate = ArrivalRate(window=5, alpha=0.5)
    estimates = [rate.observe(t) for t in range(0, 50, 10)]  # 10 ms apart
    assert estimates[:4] == [None] * 4 and estimates[4] == pytest.approx(0.010)
    for t in (100, 120, 140, 160, 180):  # 20 ms apart
        last = rate.observe(t)
    assert last == pytest.approx(0.5 * 0.010 + 0.5 * 0.020)


def test_partition_batches_give_the_stream_rate() -> None:
    """Items 10 ms apart, even ones on partition 0 and odd ones on 1, read a partition batch at a time."""
    rate = ArrivalRate(window=4, alpha=0.0)
    estimates = [rate.observe(t, 0) for t in (0, 20)] + [rate.observe(t, 1) for t in (10, 30)]
    estimates += [rate.observe(t, 0) for t in (40, 60)] + [rate.observe(t, 1) for t in (50, 70)]
    assert estimates[5] is None  # partition 0's window is complete, partition 1's not yet: no estimate
    assert estimates[-1] == pytest.approx(0.010)


def test_an_estimate_waits_for_every_assigned_partition() -> None:
    rate = ArrivalRate(window=3, alpha=0.0)
    rate.assign({0, 1})
    assert [rate.observe(t, 0) for t in (0, 20, 40)] == [None, None, None]  # partition 1 not heard from
    assert [rate.observe(t, 1) for t in (10, 30, 50)][-1] == pytest.approx(0.010)


def test_drift_replans_with_the_measured_interval_and_keeps_the_budget() -> None:
    planner = Planner(
        golden_a(), PlannerSettings(arrival_interval=3.0, decay=0.05, memory=MemorySettings.paper_elements())
    )
    switch = SwitchablePlanner(planner)
    requested: list[int | None] = []
    done = threading.Event()

    def request(budget: int | None) -> None:
        requested.append(budget)
        done.set()

    drift = DriftReplanner(switch, lambda: 2429288, ratio=1.5, cooldown_s=0).start(request)
    try:
        assert not drift.drifted(3.5)  # within [2, 4.5]
        drift.offer(3.5)
        drift.offer(12.0)  # four times slower: fewer workers are needed
        assert done.wait(10)
    finally:
        drift.close()
    assert requested == [2429288] and drift.replans == 1
    assert switch.current.arrival_interval == 12.0
    assert switch.plan(None).num_workers == 1  # ⌈(3 + 6)/12⌉


def test_a_rate_replan_of_an_unconstrained_trainer_stays_unconstrained() -> None:
    """No budget in force (None) reaches the control plane's re-planner as None: the applied plan has no
    budget, and a stream three times faster gets three times the live workers. (Passing the old plan's own
    bytes as the budget, as the trainer once did, kept 3 of 9 workers live and showed a budget nobody set.)"""
    switch = SwitchablePlanner(Planner(golden_a(), PlannerSettings(arrival_interval=3.0)))
    trainer = FakeTrainer(switch.plan(None))
    outcomes: list[ReplanOutcome] = []
    applied = threading.Event()

    def on_applied(outcome: ReplanOutcome) -> None:
        outcomes.append(outcome)
        applied.set()

    replanner = Replanner(switch, trainer, on_applied=on_applied)
    drift = DriftReplanner(switch, lambda: trainer.current_plan()[0].budget_bytes, ratio=1.5, cooldown_s=0)
    drift.start(replanner.request)
    try:
        drift.offer(1.0)  # three times the rate the plan was made for
        assert applied.wait(10)
    finally:
        drift.close()
        replanner.close()
    [(plan, version)] = trainer.applied
    assert version == 2 and plan.arrival_interval == 1.0
    assert plan.budget_bytes is None and outcomes[0].budget_bytes is None
    assert trainer.status().budget_bytes is None
    assert (plan.num_workers, plan.live_workers) == (9, 9)  # 3 live before: workers added, none removed


def test_invalid_settings() -> None:
    with pytest.raises(ConfigError):
        ArrivalRate(window=1)
    with pytest.raises(ConfigError):
        DriftReplanner(SwitchablePlanner(Planner(golden_a())), lambda: None, ratio=1.0)
