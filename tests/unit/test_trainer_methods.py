"""Every method of the engine's registry as the trainer runs it live (``services.trainer.live_methods``):
oracle trains every item in order even in a burst, 1-skip only when free, fixed-plan methods refuse a
budget (FAILED_PRECONDITION) while ferret re-plans."""

from __future__ import annotations

import math

import grpc
import pytest
import torch

from ferret_core.engine import METHOD_NAMES, SkipReason
from services.config import load_settings
from services.control.errors import BudgetNotPlanned
from services.control.servicer import status_for
from services.trainer.engine_learner import EngineLearner
from services.trainer.live_methods import DELIVERY_ITEMS, FixedPlan, QueueEveryItem, live_setup, plans_for_budget
from services.trainer.runner import build_zoo_model, load_profile
from tests.unit.test_engine_policies import tiny_profile
from tests.unit.test_engine_support import make_plan


def learner_for(method: str, workers: int = 1, stages: int = 1) -> EngineLearner:
    settings = load_settings(
        None, env={"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp", "FERRET_TRAINER_METHOD": method}
    )
    model = build_zoo_model(settings)
    return EngineLearner(model, make_plan(stages, workers, num_units=model.num_units), settings)


def burst(learner: EngineLearner, n: int) -> list[SkipReason | None]:
    """``n`` items submitted back to back (a Kafka batch), then drained."""
    gen = torch.Generator().manual_seed(0)
    outcomes = [learner.arrive(i, torch.rand(64, generator=gen), i % 10).skipped for i in range(n)]
    learner.drain(60)
    return outcomes


def test_the_registry_decides_which_methods_plan_for_a_budget() -> None:
    assert {m: plans_for_budget(m) for m in ("oracle", "1-skip", "ferret")} == {
        "oracle": False,
        "1-skip": False,
        "ferret": True,
    }
    assert all(isinstance(plans_for_budget(m), bool) for m in METHOD_NAMES)  # every registered method


def test_live_setups() -> None:
    plan = make_plan(2, 2, num_units=4)
    oracle, oracle_admission = live_setup("oracle", plan, "tiny", 4)
    assert isinstance(oracle.rules, QueueEveryItem) and oracle.plan.num_workers == oracle.plan.num_stages == 1
    assert oracle_admission is None  # every item waits its turn
    one_skip, one_skip_admission = live_setup("1-skip", plan, "tiny", 4)
    assert one_skip.rules.wait_slots == 0 and one_skip_admission is not None
    assert one_skip_admission.max_wait_s == 0.0  # trained only if free at its event time
    ferret, ferret_admission = live_setup("ferret", plan, "tiny", 4, delivery_s=0.1)
    assert ferret.plan == plan and ferret.rules.wait_slots == 1  # without an event time: the paper's slot
    assert ferret_admission is not None
    assert ferret_admission.max_wait_s == pytest.approx(math.log(2) / plan.decay)
    # K = max(⌈(W + D) / (N·t^d)⌉, ⌈B / N⌉): what reaches one worker while an item waits W, plus one
    # delivery's spread, and at least its share of one delivery of B records
    by_time = math.ceil((ferret_admission.max_wait_s + 0.1) / (plan.num_workers * plan.arrival_interval) - 1e-9)
    by_delivery = math.ceil(DELIVERY_ITEMS / plan.num_workers)
    assert ferret_admission.queue_slots == max(1, min(max(by_time, by_delivery), 4096))


def test_live_setups_report_the_methods_own_planned_bytes_given_the_profile() -> None:
    plan = make_plan(3, 2, num_units=3)
    assert live_setup("dapple", plan, "tiny", 3)[0].planned is None  # no profile: no planned bytes to report
    for method in ("dapple", "zb", "hanayo-2w", "pipedream", "pipedream-2bw", "oracle", "1-skip"):
        planned = live_setup(method, plan, "tiny", 3, profile=tiny_profile())[0].planned
        assert planned is not None and planned.memory_model == f"schedule:{method}", method
        assert planned.planned_bytes == sum(planned.memory_breakdown.values()) > 0, method
    none = live_setup("pipedream", plan, "tiny", 3, profile=tiny_profile())[0].planned
    asked = live_setup("pipedream", plan, "tiny", 3, profile=tiny_profile(), compensator="iter-fisher")[0].planned
    assert none is not None and asked is not None and asked.planned_bytes > none.planned_bytes  # its state


def test_the_learner_reports_a_schedules_planned_bytes_for_the_status() -> None:
    settings = load_settings(
        None, env={"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp", "FERRET_TRAINER_METHOD": "dapple"}
    )
    model = build_zoo_model(settings)
    profile = load_profile(settings, model)
    learner = EngineLearner(model, make_plan(2, 2, num_units=model.num_units), settings, profile)
    try:
        burst(learner, 4)
        stats = learner.stats()
    finally:
        learner.close()
    assert learner.engine.planned is not None
    assert stats.planned_bytes == learner.engine.planned.planned_bytes > 0


def test_oracle_trains_every_item_of_a_burst_in_order() -> None:
    learner = learner_for("oracle")
    try:
        assert burst(learner, 40) == [None] * 40
        assert learner.stats().backward_passes == 40
    finally:
        learner.close()


def test_one_skip_trains_only_when_free() -> None:
    learner = learner_for("1-skip")
    try:
        outcomes = burst(learner, 40)
    finally:
        learner.close()
    assert outcomes[0] is None and set(outcomes) <= {None, SkipReason.BUSY}  # busy whenever it was not free
    assert learner.stats().backward_passes == outcomes.count(None)


def test_fixed_plan_methods_refuse_a_budget_and_ferret_replans() -> None:
    for method in ("oracle", "1-skip"):
        learner = learner_for(method)
        try:
            with pytest.raises(BudgetNotPlanned, match="does not plan for a memory budget"):
                learner.apply_plan(make_plan(1, 1, num_units=learner.model.num_units))
        finally:
            learner.close()
        with pytest.raises(BudgetNotPlanned) as refused:
            FixedPlan(method).plan(2**20)
        assert status_for(refused.value)[0] == grpc.StatusCode.FAILED_PRECONDITION
        assert "ferret" in str(refused.value)  # names the methods that do plan
    learner = learner_for("ferret", workers=2, stages=2)
    try:
        burst(learner, 10)
        learner.apply_plan(make_plan(2, 1, num_units=learner.model.num_units))
        assert learner.plan.num_workers == 1
        assert burst(learner, 5).count(None) >= 1
    finally:
        learner.close()


def test_a_budget_for_a_fixed_plan_method_is_a_config_error_at_start_up() -> None:
    from ferret_core.errors import ConfigError
    from services.trainer.runner import start_trainer

    settings = load_settings(None, env={"FERRET_TRAINER_METHOD": "1-skip", "FERRET_TRAINER_BUDGET_BYTES": "64MiB"})
    with pytest.raises(ConfigError, match=r"'1-skip' does not plan for a memory budget.*ferret"):
        start_trainer(settings)


def test_a_replan_that_only_moves_the_rate_keeps_the_running_pipeline() -> None:
    """A plan equal to the one in force apart from the arrival interval (and what follows from it) does not
    drain or rebuild the pipeline: the same clock runs on, undrained, and reports the new plan; a plan with
    other stages is rebuilt."""
    import dataclasses

    learner = learner_for("ferret")
    try:
        burst(learner, 6)
        clock, engine = learner.clock, learner.engine
        faster = dataclasses.replace(learner.plan, arrival_interval=learner.plan.arrival_interval / 2)
        learner.apply_plan(faster)
        assert learner.clock is clock and learner.engine is engine
        assert learner.plan == faster and learner.engine.planned == faster
        assert burst(learner, 4).count(None) >= 1
        learner.apply_plan(make_plan(2, 1, num_units=learner.model.num_units))
        assert learner.clock is not clock and learner.plan.num_stages == 2
    finally:
        learner.close()
