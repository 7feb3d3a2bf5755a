"""The guard's sequential test (services/trainer/guard/cusum.py): a CUSUM of Wald's SPRT on the discordant
pairs of live-vs-shadow correctness. Equal models do not trigger it, a clearly worse live model does, and
concept drift that hurts both models on the same items adds no evidence."""

from __future__ import annotations

import random

import pytest

from ferret_core.errors import ConfigError
from services.trainer.guard.cusum import CusumSettings, DiscordantCusum, Verdict


def run(pairs: list[tuple[bool, bool]], settings: CusumSettings | None = None) -> int | None:
    """The index of the first WORSE verdict (None: never)."""
    test = DiscordantCusum(settings or CusumSettings())
    for i, (live, shadow) in enumerate(pairs):
        if test.observe(live, shadow) is Verdict.WORSE:
            return i
    return None


def independent(n: int, live_acc: float, shadow_acc: float, seed: int) -> list[tuple[bool, bool]]:
    rng = random.Random(seed)
    return [(rng.random() < live_acc, rng.random() < shadow_acc) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_equal_models_do_not_roll_back(seed: int) -> None:
    # 20,000 items at 80 % each, independent errors: ~6,400 discordant pairs, below 1/false_alarm = 10,000
    assert run(independent(20_000, 0.8, 0.8, seed)) is None


@pytest.mark.parametrize("seed", range(5))
def test_a_clearly_worse_live_model_rolls_back_within_a_few_hundred_items(seed: int) -> None:
    found = run(independent(2_000, 0.3, 0.9, seed))
    assert found is not None and found < 300


def test_concept_drift_that_hurts_both_models_adds_no_evidence() -> None:
    rng = random.Random(0)
    before = [(ok, ok) for ok in (rng.random() < 0.9 for _ in range(1_000))]  # the same items right
    after = [(False, False)] * 5_000  # a label permutation: both wrong on every item
    assert run(before + after) is None


def test_live_wins_floor_the_statistic_at_zero() -> None:
    test = DiscordantCusum(CusumSettings())
    for _ in range(100):
        test.observe(True, False)  # the live model is better
    assert test.statistic == 0.0 and test.live_wins == 100
    test.observe(False, True)
    assert test.statistic == pytest.approx(0.405, abs=1e-3)  # ln(0.75 / 0.5): one shadow win from zero


def test_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match="worse_share"):
        CusumSettings(worse_share=0.5)
    with pytest.raises(ConfigError, match="false_alarm"):
        CusumSettings(false_alarm=0.0)
