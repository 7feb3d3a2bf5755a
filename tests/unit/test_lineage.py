"""Model lineages: a restore or rollback begins a new line of updates, so (lineage, version) names one set
of weights even where the version number goes back (services/trainer/lineage.py)."""

from __future__ import annotations

import torch

from services.kafka.record_codec import ValidSample
from services.trainer.learner import ArrivalOutcome
from services.trainer.lineage import Lineage
from services.trainer.predictions import prediction_message
from tests.unit.test_trainer_checkpoints import trained_learner


def test_a_branch_is_later_than_every_lineage_before_even_within_a_millisecond() -> None:
    now = [1000]
    lineage = Lineage(lambda: now[0])
    assert lineage.value == 1000
    assert lineage.branch() == 1001 and lineage.branch() == 1002  # the clock stood still
    now[0] = 5000
    assert lineage.branch() == 5000  # the wall clock moved on


def test_a_restore_takes_the_version_back_on_a_new_lineage_and_outcomes_carry_it() -> None:
    learner = trained_learner(items=40)
    try:
        before = learner.stats()
        tensors = learner.state_tensors()
        assert int(tensors["engine.lineage"]) == before.model_lineage > 0
        gen = torch.Generator().manual_seed(1)
        for i in range(40, 60):
            learner.arrive(i, torch.rand(1, 8, 8, generator=gen), i % 10)
        learner.drain(60)
        assert learner.stats().model_version > before.model_version
        learner.load_state_tensors(tensors)  # a restore of the earlier snapshot
        after = learner.stats()
        assert after.model_version == before.model_version  # the number goes back ...
        assert after.model_lineage > before.model_lineage  # ... along a new lineage
        outcome = learner.arrive(60, torch.rand(1, 8, 8, generator=gen), 0)
        assert (outcome.model_lineage, outcome.model_version) == (after.model_lineage, after.model_version)
        assert int(learner.state_tensors()["engine.lineage"]) == after.model_lineage
    finally:
        learner.close()


def test_a_prediction_carries_its_lineage() -> None:
    outcome = ArrivalOutcome(3, 0.9, 17, None, 0, ((3, 0.9),), model_lineage=1_700_000_000_123)
    sample = ValidSample(sample_id="s", sequence=5, event_time_ms=0, x=torch.zeros(2), label=3, task=0, stream="t")
    message = prediction_message(
        sample, outcome, item=5, online_accuracy=100.0, duplicate=False, plan_version=1, instance_id="r0",
        partition=0, offset=5, latency_ms=1.0, time_ms=0,
    )  # fmt: skip
    assert (message.model_lineage, message.model_version) == (1_700_000_000_123, 17)
