"""The recall test (services/trainer/guard/recall.py): at a return of the shadow's concept, the live model and
the weights from before the fall both predict labelled items kept from before it, and Wald's SPRT on their
discordant pairs rolls back at once. Hand computations of the test, the buffer's bookkeeping (only items from
before the fall are used), and the guarded learner around the fake learner of test_guard_learner.py: a live
model that is right on the items since the return but lost part of what it knew is rolled back at the return
by this test, and by no rule without it."""

from __future__ import annotations

import math
import random

import pytest
import torch

from ferret_core.errors import ConfigError
from services.trainer.guard.cusum import CusumSettings
from services.trainer.guard.recall import RecallBuffer, recall_test
from tests.unit.test_guard_learner import GOOD, feed, guarded, items

LEVEL = CusumSettings(0.01, 0.75)  # the defaults: threshold ln(100) = 4.61 nats, a target win ln(1.5) = 0.405
BURST_FIT = -GOOD  # the burst's flipped labels, fitted
# class 1 iff x0 + x1 > 0: right on every item where x0 and x0 + x1 share a sign, wrong on the quarter between
DIAGONAL = torch.tensor([[-0.5, -0.5], [0.5, 0.5]])
QUIET_CUSUM = 1e-12  # the CUSUM cannot fire in these streams


def test_twelve_target_wins_and_no_live_win_reach_ln_100_at_the_twelfth() -> None:
    labels = [1] * 20
    live = [0] * 12 + [1] * 8  # wrong on the first 12
    target = [1] * 20
    r = recall_test(live, target, labels, LEVEL)
    assert r.worse and r.decided_after == 12  # 12 × ln 1.5 = 4.87 ≥ 4.61 > 11 × ln 1.5 = 4.46
    assert (r.target_wins, r.live_wins) == (12, 0) and r.llr == pytest.approx(12 * math.log(1.5))
    assert "won 12 and the live model 0" in r.describe()


def test_live_wins_count_against_the_rollback() -> None:
    labels = [1] * 40
    live = [0] * 12 + [1] * 28  # 12 target wins ...
    target = [1] * 12 + [0] * 4 + [1] * 24  # ... then 4 live wins, but the 12th target win came first
    assert recall_test(live, target, labels, LEVEL).worse
    live_first = [1] * 4 + [0] * 12 + [1] * 24  # the 4 live wins first: 12 × 0.405 − 4 × 0.693 = 2.09 nats
    target_first = [0] * 4 + [1] * 36
    r = recall_test(live_first, target_first, labels, LEVEL)
    assert not r.worse and r.decided_after is None
    assert r.llr == pytest.approx(12 * math.log(1.5) + 4 * math.log(0.5))


def test_equal_predictions_are_no_evidence() -> None:
    rng = random.Random(3)
    labels = [rng.randrange(10) for _ in range(256)]
    guesses = [rng.randrange(10) for _ in range(256)]
    r = recall_test(guesses, guesses, labels, LEVEL)
    assert not r.worse and r.target_wins == r.live_wins == 0 and r.llr == 0.0


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="as many predictions as labels"):
        recall_test([1, 2], [1], [1, 2], LEVEL)


def test_the_buffer_gives_the_newest_items_from_before_the_fall() -> None:
    buffer = RecallBuffer(3)
    for position in range(1, 9):
        buffer.keep(position, torch.tensor([float(position)]), position % 2)
    assert len(buffer) == 6  # twice the capacity kept
    kept = buffer.before(5)
    assert kept is not None
    xs, labels = kept
    assert xs.flatten().tolist() == [3.0, 4.0, 5.0] and labels == [1, 0, 1]  # the newest 3 at or before 5
    buffer.drop_after(4)  # the fall began at 4: the items compared after it were the burst's
    assert len(buffer) == 2 and buffer.before(100) is not None
    assert buffer.before(2) is None  # nothing that old is kept
    buffer.clear()
    assert buffer.before(100) is None


def test_a_buffer_of_no_items_keeps_nothing_and_a_negative_one_is_refused() -> None:
    buffer = RecallBuffer(0)
    buffer.keep(1, torch.zeros(1), 0)
    assert len(buffer) == 0 and buffer.before(1) is None
    with pytest.raises(ConfigError, match="recall_items must be >= 0"):
        RecallBuffer(-1)


def diagonal_right(n: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    """Clean items on which DIAGONAL is right (x0 and x0 + x1 of one sign), labelled by GOOD's rule."""
    return [(x, y) for x, y in items(4 * n, seed) if (x[0] > 0) == (x[0] + x[1] > 0)][:n]


def burst_then_diagonal(**overrides: float) -> tuple[list, torch.Tensor]:
    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation_items=400, **overrides)
    feed(learner, items(300, seed=51), 0)
    inner.set_weight(BURST_FIT)  # the burst: flipped labels, the live model fits them
    feed(learner, items(200, seed=52, permute=True), 300)
    inner.set_weight(DIAGONAL)  # labels back; the live model is right on the items that come now ...
    feed(learner, diagonal_right(300, seed=53), 500)  # ... and wrong on a quarter of the clean ones before
    return learner.take_events(), inner.net.weight.detach().clone()


def test_a_live_model_right_since_the_return_but_worse_before_the_fall_is_rolled_back_at_the_return() -> None:
    events, weight = burst_then_diagonal()
    rollbacks = [e for e in events if e.kind == "rollback"]
    assert len(rollbacks) == 1
    assert 500 < rollbacks[0].item < 600  # ADWIN sees the rise within ~2 of its 32-item checks
    assert "items kept from before the fall" in rollbacks[0].detail and "recall SPRT" in rollbacks[0].detail
    assert rollbacks[0].model_version <= 300  # weights from before the burst
    assert torch.equal(weight, GOOD)


def test_without_the_recall_test_the_same_model_is_kept() -> None:
    events, weight = burst_then_diagonal(recall_items=0)
    assert not [e for e in events if e.kind == "rollback"]  # no shadow win since the return: nothing to test
    assert torch.equal(weight, DIAGONAL)


def test_the_rule_off_turns_the_recall_test_off_too() -> None:
    events, weight = burst_then_diagonal(recurrence_level=0.0)
    assert not [e for e in events if e.kind == "rollback"]
    assert torch.equal(weight, DIAGONAL)


def test_on_a_stream_whose_labels_all_come_late_the_recall_test_keeps_the_late_labelled_items() -> None:
    from tests.unit.test_guard_late_labels import late_stream

    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation_items=400)
    learner.late_label(-1, 0, True)  # a first late label: the shadow predicts unlabelled items from now on
    late_stream(learner, items(300, seed=54), 0)
    inner.set_weight(BURST_FIT)
    late_stream(learner, items(200, seed=55, permute=True), 300)
    inner.set_weight(DIAGONAL)
    late_stream(learner, diagonal_right(300, seed=56), 500)
    rollbacks = [e for e in learner.take_events() if e.kind == "rollback"]
    assert len(rollbacks) == 1 and "recall SPRT" in rollbacks[0].detail
    assert 500 < rollbacks[0].item < 650  # labels 30 items late: the return is seen ~30 items later too
    assert torch.equal(inner.net.weight, GOOD)
