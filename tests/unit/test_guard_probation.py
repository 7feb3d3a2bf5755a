"""Promotion on probation (services/trainer/guard/learner.py, ``guard.probation_items``): a passing window's
weights become last-good only after that many further compared items with no rollback; a rollback during
the probation drops the candidates and returns to the last-good weights (a temporary label flip is undone),
while under a permanent drift the candidates are promoted after the probation with no rollback. Uses the
fake learner of test_guard_learner.py (``set_weight`` is what the test does to the live model)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from services.config.sections import GuardSettings
from services.trainer.guard.events import ModelEvent
from services.trainer.guard.learner import GuardedLearner
from services.trainer.learner import ArrivalOutcome, ModelDivergedError
from tests.unit.test_guard_learner import GOOD, FakeLearner, feed, guarded, items, linear_model

WINDOW, PROBATION = 50, 100  # compared items; every item is labelled and compared here (shadow_every 1)


def probation_guard(**overrides: Any) -> tuple[GuardedLearner, FakeLearner]:
    """Probation for every passing window and the CUSUM alone (``guard.probation: always``, the recurrence
    rule off): what this file pins down; test_guard_recurrence.py covers the defaults."""
    settings = {"window": WINDOW, "probation_items": PROBATION, "probation": "always", "recurrence_level": 0.0}
    return guarded(**{**settings, **overrides})


def events(learner: GuardedLearner, kind: str) -> list[ModelEvent]:
    return [e for e in learner.take_events() if e.kind == kind]


def test_a_candidate_is_not_promoted_before_its_probation_ends() -> None:
    learner, _ = probation_guard()
    feed(learner, items(WINDOW + PROBATION, seed=11), 0)  # the first window passed at 50; its probation ends at 150
    stats = learner.stats().guard
    assert stats is not None and stats.promotions == 0
    feed(learner, items(WINDOW + 1, seed=12), WINDOW + PROBATION)  # carried out between batches: at item 150
    stats = learner.stats().guard
    assert stats is not None and stats.promotions == 2 and stats.rollbacks == 0
    promoted = events(learner, "promotion")
    assert [(e.item, e.model_version) for e in promoted] == [(149, 0), (199, 50)]  # decided at 150 and 200 compared
    assert stats.last_good_version == 50  # the weights that started the second window
    assert "on probation with no rollback" in promoted[0].detail


def test_probation_zero_promotes_at_the_verdict() -> None:
    learner, _ = probation_guard(probation_items=0)
    feed(learner, items(2 * WINDOW + 1, seed=13), 0)
    assert [(e.item, e.model_version) for e in events(learner, "promotion")] == [(49, 0), (99, 50)]


def flip_stream(learner: GuardedLearner, inner: FakeLearner) -> None:
    """300 clean items; a 100-item burst that the live model fits (its weights flipped, the labels
    flipped: the live model right on every burst item, the shadow wrong); then true labels again with the
    flip-trained live model, until item 700."""
    feed(learner, items(300, seed=14), 0)
    inner.set_weight(-GOOD)
    feed(learner, items(100, seed=15, permute=True), 300)
    feed(learner, items(300, seed=16), 400)


def test_a_rollback_during_probation_drops_the_candidates_and_returns_to_the_pre_burst_weights() -> None:
    learner, inner = probation_guard()
    flip_stream(learner, inner)
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 1
    taken = learner.take_events()
    rollback = next(e for e in taken if e.kind == "rollback")
    assert 400 < rollback.item < 430  # the true labels return at 400: 23 shadow wins reach h = 9.2 nats
    assert rollback.model_version <= 300 < 400 < rollback.previous_model_version  # to weights from before the burst
    before = [e.model_version for e in taken if e.kind == "promotion" and e.item < rollback.item]
    assert before and max(before) <= 300  # v350 (flip-trained, its window passed at 400) never became last-good
    assert torch.equal(inner.net.weight, GOOD)  # the live model (and every later promotion) has the true concept
    # (versions after the rollback count on from v250 again: the numbers of the abandoned branch are reused)


def test_without_probation_the_flip_trained_weights_become_last_good_and_nothing_rolls_back() -> None:
    learner, inner = probation_guard(probation_items=0)  # the behaviour probation replaces
    flip_stream(learner, inner)
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 0
    assert any(e.model_version == 350 for e in events(learner, "promotion"))  # the flipped weights, promoted


def test_under_a_permanent_drift_the_candidate_is_promoted_after_its_probation_with_no_rollback() -> None:
    learner, inner = probation_guard()
    feed(learner, items(300, seed=17), 0)
    inner.set_weight(-GOOD)  # the live model learnt the new concept at once; the shadow keeps the old one
    feed(learner, items(400, seed=18, permute=True), 300)
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 0
    promoted = [(e.item, e.model_version) for e in events(learner, "promotion")]
    drifted = [(item, v) for item, v in promoted if v >= 350]  # weights of the new concept
    assert drifted and drifted[0] == (499, 350)  # its window passed at 400 compared items, + 100 on probation
    assert stats.last_good_version >= 350


def test_a_restore_drops_the_candidates_on_probation() -> None:
    learner, inner = probation_guard()
    feed(learner, items(2 * WINDOW, seed=19), 0)  # two candidates on probation (v0 due at 150, v50 at 200)
    restored = {k: v.clone() for k, v in inner.state_tensors().items()}
    restored["engine.updates"] = torch.tensor(1000)
    learner.load_state_tensors(restored)
    feed(learner, items(150, seed=20), 2 * WINDOW)
    assert learner.stats().guard.last_good_version == 1000  # type: ignore[union-attr]
    assert all(e.model_version >= 1000 for e in events(learner, "promotion"))  # none of the old candidates


class DivergingLearner(FakeLearner):
    """The fake learner whose outcome for item ``at`` is a ModelDivergedError (a non-finite output)."""

    def __init__(self, at: int) -> None:
        super().__init__(linear_model())
        self.at = at

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        waiting = super().submit(item, x, y, event_time_ms)
        if item != self.at:
            return waiting

        def diverged() -> ArrivalOutcome:
            raise ModelDivergedError(item, 1e30, 0.01)

        return diverged


def test_a_divergence_during_probation_drops_the_candidates() -> None:
    inner = DivergingLearner(at=3 * WINDOW + 1)
    settings = GuardSettings(window=WINDOW, probation_items=PROBATION, probation="always", recurrence_level=0.0)
    learner = GuardedLearner(inner, linear_model(), settings)
    feed(learner, items(3 * WINDOW + 1, seed=21), 0)  # last-good v0 (promoted at 150), v50 and v100 on probation
    with pytest.raises(ModelDivergedError):
        learner.arrive(3 * WINDOW + 1, *items(1, seed=22)[0])
    feed(learner, items(PROBATION, seed=23), 3 * WINDOW + 2)
    taken = learner.take_events()
    rollback = next(e for e in taken if e.kind == "rollback")
    assert rollback.model_version == 0 and "diverged" in rollback.detail
    assert not any(e.kind == "promotion" and e.model_version in (50, 100) for e in taken)
