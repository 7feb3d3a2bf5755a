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


def correlated(n: int, both: float, shadow_only: float, live_only: float, seed: int) -> list[tuple[bool, bool]]:
    """Items on which both models are right (``both``), only the shadow (``shadow_only``), only the live one."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        r = rng.random()
        if r < both:
            out.append((True, True))
        elif r < both + shadow_only:
            out.append((False, True))
        elif r < both + shadow_only + live_only:
            out.append((True, False))
        else:
            out.append((False, False))
    return out


def test_a_slightly_worse_live_model_is_significant_but_not_material() -> None:
    """The demo's false rollbacks: the shadow wins 3 of 4 discordant pairs (θ₁ exactly) but they are 4 % of
    the items, so the live model is only 2 points worse: over 3,000 items the statistic reaches h on most
    streams, and the drop gate holds on every one."""
    streams = [correlated(3_000, both=0.30, shadow_only=0.03, live_only=0.01, seed=seed) for seed in range(20)]
    significant = sum(run(pairs, CusumSettings(min_drop=0.0)) is not None for pairs in streams)
    material = sum(run(pairs, CusumSettings(min_drop=0.05)) is not None for pairs in streams)
    assert significant >= 15 and material == 0, (significant, material)


@pytest.mark.parametrize("seed", range(5))
def test_a_collapse_passes_the_drop_gate_as_fast_as_without_it(seed: int) -> None:
    pairs = independent(2_000, 0.1, 0.85, seed)
    assert run(pairs, CusumSettings(min_drop=0.05)) == run(pairs, CusumSettings(min_drop=0.0)) is not None


def test_concordant_items_at_the_floor_are_in_no_run() -> None:
    """A long agreeing stretch before a collapse (equal models, then a poisoned live model) must not dilute
    the collapse's drop: the run starts with the shadow win that lifts the statistic."""
    test = DiscordantCusum(CusumSettings(min_drop=0.25))
    for _ in range(200):
        assert test.observe(True, True) is Verdict.CONTINUE
    assert test.run_drop == 0.0
    verdicts = [test.observe(False, True) for _ in range(30)]
    assert test.run_drop == 1.0
    assert Verdict.WORSE in verdicts  # h = 9.2 nats at ln(1.5) a shadow win: the 23rd


def test_the_drop_counts_the_run_since_the_statistic_left_its_floor() -> None:
    test = DiscordantCusum(CusumSettings(min_drop=0.05))
    for _ in range(50):  # a good stretch: live wins floor the statistic, the run restarts
        test.observe(True, False)
    assert test.run_drop == 0.0
    for _ in range(10):
        test.observe(False, True)
    for _ in range(30):
        test.observe(True, True)
    assert test.run_drop == pytest.approx(10 / 40)
    test.reset()
    assert test.run_drop == 0.0
    with pytest.raises(ConfigError, match="min_drop"):
        CusumSettings(min_drop=1.0)
