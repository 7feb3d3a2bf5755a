"""Late labels in the guard (GuardedLearner.late_label): once the record path has joined a late label, the
shadow predicts unlabelled items too and keeps its class until the item's label comes, so a live model that
turns bad on a stream whose labels all come late is rolled back as one whose labels come with the samples.
Uses the fake learner of test_guard_learner.py."""

from __future__ import annotations

import torch

from services.trainer.guard.learner import GuardedLearner
from tests.unit.test_guard_learner import GOOD, guarded, items

DELAY = 30  # items between a sample and its label


def late_stream(learner: GuardedLearner, data: list[tuple[torch.Tensor, int]], start: int) -> None:
    """Every item arrives unlabelled; its label comes ``DELAY`` items later (the record path's join)."""
    predicted: dict[int, int] = {}
    for i, (x, _) in enumerate(data):
        item = start + i
        predicted[item] = learner.arrive(item, x, None).predicted_class
        due = item - DELAY
        if due >= start:
            learner.late_label(due, data[due - start][1], predicted.pop(due) == data[due - start][1])


def test_before_any_late_label_the_shadow_predicts_no_unlabelled_item() -> None:
    learner, _ = guarded()
    for i, (x, _) in enumerate(items(100, seed=41)):
        learner.arrive(i, x, None)
    assert learner.stats().guard.shadow_items == 0  # type: ignore[union-attr]


def test_a_live_model_gone_bad_on_late_labelled_items_is_rolled_back() -> None:
    learner, inner = guarded()
    learner.late_label(-1, 0, True)  # a first late label (of an item no longer known): shadowing starts
    late_stream(learner, items(300, seed=42), 0)
    inner.set_weight(-GOOD)  # wrecked: wrong on every item from now on, the shadow right
    late_stream(learner, items(200, seed=43), 300)
    rollbacks = [e for e in learner.take_events() if e.kind == "rollback"]
    # decided by the late label of an item predicted by the wrecked model: ~23 shadow wins after item 300;
    # the labels of the ~30 items the wrecked model predicted before the rollback come after it and are not
    # compared (else their shadow wins, 12 nats, would roll the restored model back a second time)
    assert len(rollbacks) == 1 and 300 <= rollbacks[0].item < 360
    assert torch.equal(inner.net.weight, GOOD)
    assert learner.stats().guard.shadow_items >= 400  # type: ignore[union-attr]

