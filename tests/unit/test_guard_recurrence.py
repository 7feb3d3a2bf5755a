"""The recurrence rule (services/trainer/guard/recurrence.py) and promotion on probation for suspect windows
only (``guard.probation: suspect``, the default): a burst whose labels return is rolled back even when the
live model has half re-learnt them (too few shadow wins for the CUSUM), a lasting drift is not, a stream
the shadow keeps knowing promotes at each verdict. Uses the fake learner of test_guard_learner.py."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.errors import ConfigError
from services.trainer.guard.recurrence import Recurrence, RecurrenceWatch, Returned, rise_point
from tests.unit.test_guard_learner import GOOD, feed, guarded, items

OTHER_FEATURE = torch.tensor([[0.0, -1.0], [0.0, 1.0]])  # reads x[1]: right on half the items, by chance
# a probation longer than the 200-item burst keeps its weights from becoming last-good (as the defaults, 500)
BEYOND_THE_BURST = 400
QUIET_CUSUM = 1e-12  # h = 27.6 nats: the CUSUM cannot fire in these streams, so a rollback is the rule's


@given(st.integers(1, 60), st.integers(1, 60))
def test_the_rise_point_of_a_clean_step_is_the_step(low: int, high: int) -> None:
    assert rise_point([False] * low + [True] * high) == low


def watch_stream(watch: RecurrenceWatch, pairs: list[tuple[bool, bool]], start: int = 0) -> list[Returned | Recurrence]:
    """Feed (live correct, shadow correct) pairs; what the watch said, in order."""
    said = [watch.observe(start + i, live, shadow, start + i + 1) for i, (live, shadow) in enumerate(pairs)]
    return [s for s in said if s is not None]


def test_the_threshold_is_ville_s_for_the_level() -> None:
    assert RecurrenceWatch(0.01).threshold == pytest.approx(math.log(100))
    assert RecurrenceWatch(0.0).threshold == math.inf
    with pytest.raises(ConfigError, match=r"\[0, 1\)"):
        RecurrenceWatch(1.0)


def test_a_concept_that_leaves_and_returns_to_a_worse_live_model_is_a_recurrence() -> None:
    rng = random.Random(1)
    watch = RecurrenceWatch(0.01)
    before = [(True, True)] * 300
    burst = [(rng.random() < 0.5, False) for _ in range(200)]  # the live model fits the burst, the shadow cannot
    after = [(rng.random() < 0.5, True) for _ in range(200)]  # labels back: live half right, the shadow right
    assert watch_stream(watch, before + burst) == []
    assert watch.suspect and watch.fell_from is not None and watch.fell_from <= 300  # the fall began by item 300
    said = watch_stream(watch, after, 500)
    worse = [s for s in said if isinstance(s, Recurrence)]
    assert len(worse) == 1 and 500 < worse[0].item < 600  # ADWIN sees the rise within ~2 of its 32-item checks
    assert worse[0].llr >= math.log(100) and worse[0].returned.fell_from <= 300
    assert not watch.suspect  # decided


def test_a_return_to_a_live_model_as_good_as_the_shadow_is_not() -> None:
    watch = RecurrenceWatch(0.01, horizon=50)
    pairs = [(True, True)] * 300 + [(False, False)] * 200 + [(True, True)] * 200  # both fall, both come back
    said = watch_stream(watch, pairs)
    assert [type(s) for s in said] == [Returned]  # reported, no evidence against the live model
    assert not watch.suspect  # the test ran its horizon out


def test_a_lasting_drift_never_returns() -> None:
    watch = RecurrenceWatch(0.01)
    rng = random.Random(2)
    pairs = [(True, True)] * 300 + [(rng.random() < 0.9, False) for _ in range(2000)]
    assert watch_stream(watch, pairs) == []
    assert watch.suspect


def test_level_zero_reports_the_return_but_never_rolls_back() -> None:
    watch = RecurrenceWatch(0.0)
    pairs = [(True, True)] * 300 + [(True, False)] * 200 + [(False, True)] * 200
    assert [type(s) for s in watch_stream(watch, pairs)] == [Returned]


def test_a_burst_the_live_model_half_relearnt_is_rolled_back_by_the_rule_not_the_cusum() -> None:
    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation_items=BEYOND_THE_BURST)
    feed(learner, items(300, seed=31), 0)
    inner.set_weight(-GOOD)  # the burst: flipped labels, the live model fits them
    feed(learner, items(200, seed=32, permute=True), 300)
    inner.set_weight(OTHER_FEATURE)  # true labels again; the live model is right on half of them
    feed(learner, items(100, seed=33), 500)  # 100 items: ~50 shadow wins, ~20 nats, too few for the CUSUM
    taken = learner.take_events()
    rollbacks = [e for e in taken if e.kind == "rollback"]
    assert len(rollbacks) == 1 and 500 < rollbacks[0].item < 600
    assert "came back" in rollbacks[0].detail and "SPRT" in rollbacks[0].detail
    assert rollbacks[0].model_version <= 300  # weights from before the burst
    assert torch.equal(inner.net.weight, GOOD)


def test_without_the_rule_the_same_burst_is_not_rolled_back() -> None:
    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation_items=BEYOND_THE_BURST, recurrence_level=0.0)
    feed(learner, items(300, seed=31), 0)
    inner.set_weight(-GOOD)
    feed(learner, items(200, seed=32, permute=True), 300)
    inner.set_weight(OTHER_FEATURE)
    feed(learner, items(100, seed=33), 500)  # 100 items: ~50 shadow wins, ~20 nats, too few for the CUSUM
    assert learner.stats().guard.rollbacks == 0  # type: ignore[union-attr]


def test_a_lasting_drift_is_promoted_after_its_probation_with_no_rollback() -> None:
    learner, inner = guarded()  # window 50, probation 100; probation "suspect", the rule at 0.01
    feed(learner, items(300, seed=34), 0)
    inner.set_weight(-GOOD)  # the new concept, for good
    feed(learner, items(600, seed=35, permute=True), 300)
    stats = learner.stats().guard
    assert stats is not None and stats.rollbacks == 0
    promoted = [e for e in learner.take_events() if e.kind == "promotion"]
    new_concept = [e for e in promoted if e.model_version >= 350]
    assert new_concept and "on probation" in new_concept[0].detail  # the drift's windows were suspect


def test_windows_the_shadow_keeps_knowing_are_promoted_at_their_verdict() -> None:
    learner, _ = guarded()
    feed(learner, items(151, seed=36), 0)
    promoted = [e for e in learner.take_events() if e.kind == "promotion"]
    assert [(e.item, e.model_version) for e in promoted] == [(49, 0), (99, 50), (149, 100)]
    assert not any("probation" in e.detail for e in promoted)


def test_the_rollback_goes_to_the_newest_weights_from_before_the_fall_not_the_older_last_good() -> None:
    # every passing window on probation: the last-good stays v0 while v50 … v300 wait as candidates
    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation="always", probation_items=BEYOND_THE_BURST)
    feed(learner, items(301, seed=37), 0)  # the window judged at item 299 made v300 (clean) a candidate
    inner.set_weight(-GOOD)
    feed(learner, items(200, seed=38, permute=True), 301)
    inner.set_weight(OTHER_FEATURE)
    feed(learner, items(100, seed=39), 501)
    rollbacks = [e for e in learner.take_events() if e.kind == "rollback"]
    assert len(rollbacks) == 1
    assert 250 <= rollbacks[0].model_version <= 300  # a candidate from just before the burst, not v0
    assert "newest weights from before the fall" in rollbacks[0].detail
    assert learner.stats().guard.last_good_version == rollbacks[0].model_version  # type: ignore[union-attr]
    assert torch.equal(inner.net.weight, GOOD)


def test_weights_trained_while_the_concept_was_away_are_never_promoted_once_it_returns() -> None:
    learner, inner = guarded(false_alarm=QUIET_CUSUM, probation_items=BEYOND_THE_BURST)
    feed(learner, items(301, seed=40), 0)
    inner.set_weight(-GOOD)  # the burst: the live model fits it
    feed(learner, items(200, seed=41, permute=True), 301)
    inner.set_weight(GOOD)  # labels back, and the live model has re-learnt them at once: nothing to roll back
    feed(learner, items(1000, seed=42), 501)
    taken = learner.take_events()
    assert not [e for e in taken if e.kind == "rollback"]
    flip_trained = [e for e in taken if e.kind == "promotion" and 300 < e.model_version <= 500]
    assert flip_trained == []  # v350 … v500 were candidates on probation; dropped when the concept returned
    assert learner.stats().guard.last_good_version > 500  # type: ignore[union-attr]  # promotions resumed after
    assert torch.equal(inner.net.weight, GOOD)
