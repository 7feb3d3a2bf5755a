"""The sequential test that decides a rollback: Page's CUSUM of Wald's log-likelihood ratio on the
*discordant pairs* of live-vs-shadow correctness (a repeated one-sided sequential binomial test, the
sequential form of McNemar's test).

Both models predict the same labelled items. Only the items where exactly one of them is right carry
evidence about which is better (McNemar): a *shadow win* (shadow right, live wrong) or a *live win*.
Under H0 (equally good) a discordant pair is a shadow win with probability 1/2; under H1 (the live model
is worse) with probability θ₁ = ``worse_share`` (default 0.75). Each pair adds Wald's log-likelihood ratio

    shadow win: ln(θ₁ / ½)        live win: ln((1 − θ₁) / ½)

to a statistic floored at 0 (Page's CUSUM: a repeated SPRT whose lower boundary is 0), and the test rejects
H0 (roll back) when the statistic reaches h = ln(1 / ``false_alarm``). By Lorden's bound the mean number of
discordant pairs between false alarms under H0 is at least e^h = 1 / ``false_alarm`` (default 1e-4: at
least 10,000 pairs); under H1 the mean delay is about h / KL(θ₁ ‖ ½) pairs (θ₁ = 0.75: 0.131 nats a pair,
~70 pairs at h = 9.2; fewer the worse the live model is).

**A material drop too** (``min_drop``): the discordant pairs say *whether* the live model is worse, not by how
much: a CUSUM run of 36 shadow wins against 12 live wins is strong evidence (θ₁ = 0.75 exactly) even when
it came over ~900 compared items, i.e. the live model ~2.7 points below the shadow. That is ordinary SGD
noise while a model learns (its accuracy is not monotone early on: MNISTNet at 20–35 % moved ±10 points
between checkpoints), and rolling it back each time traps the learner at its last-good weights (the 2-core
demo: 7 rollbacks to the same weights on a clean stream, the live model stuck at 34.5 % test accuracy where
the unguarded one reached 71 %). So the test also counts every compared item of the current run (since
the statistic last stood at its floor) and rejects only when the shadow's accuracy over that run exceeds the
live model's by at least ``min_drop``: a collapse (fuzz: 27–73 points over the run) passes at once; noise
does not. The default, 0.25 (stop 34; 0.05 at stop 33), is measured in the demo's regime (lr 1e-3, half
the items trained; ``benchmarks/guard/false_alarms.py``): on clean MNIST streams the CUSUM's false alarms
came with the shadow 8.4–25.9 points ahead over their runs (SGD noise at batch 1 moves a learning model
that far against a snapshot a few hundred updates old), 13 of 13 false alarms at 0.05 cost 4.9–7.6
points of online accuracy, and at 0.25 one remained (25.9) and cost nothing measurable; fuzz bursts were
rolled back 228–258 items after their start at either value. A flipped-label burst is the recurrence
rule's (:mod:`.recurrence`, not gated). ``min_drop`` 0 is the statistical test alone.

Why this test: concept drift (a task change, a label permutation) makes *both* models wrong on the same
items; those pairs are concordant and add nothing, so drift alone cannot trigger a rollback, while a live
model that lost what the shadow still knows shows up as shadow wins. Items are counted, not weighted, so
the test needs nothing but two booleans per item.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from ferret_core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class CusumSettings:
    """``false_alarm``: at most one false alarm per 1/``false_alarm`` discordant pairs on average under
    equal models; ``worse_share``: θ₁, the shadow's share of the discordant pairs the test is tuned to
    detect."""

    false_alarm: float = 1e-4
    worse_share: float = 0.75
    min_drop: float = 0.0  # the accuracy gap (a share) the run must show too (module docstring); 0: none

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_drop < 1.0:
            raise ConfigError(f"min_drop must lie in [0, 1), got {self.min_drop}: an accuracy gap, a share; e.g. 0.05")
        if not 0.0 < self.false_alarm < 1.0:
            raise ConfigError(f"false_alarm must lie in (0, 1), got {self.false_alarm}; e.g. 1e-4")
        if not 0.5 < self.worse_share < 1.0:
            raise ConfigError(
                f"worse_share must lie in (0.5, 1), got {self.worse_share}: the shadow's share of the "
                "discordant pairs under the alternative (0.5 is no difference); e.g. 0.75"
            )

    @property
    def threshold(self) -> float:
        """h = ln(1 / false_alarm), in nats."""
        return math.log(1.0 / self.false_alarm)


class Verdict(Enum):
    CONTINUE = "continue"  # not enough evidence yet
    WORSE = "worse"  # H0 rejected: the live model is worse than the shadow


class DiscordantCusum:
    """The test's state: feed each item's (live correct, shadow correct), read the verdict. ``floor``:
    Page's CUSUM (the statistic never below 0, default); without it, one SPRT from the first pair on (the
    recurrence rule's test from a return, :mod:`.recurrence`)."""

    def __init__(self, settings: CusumSettings, *, floor: bool = True) -> None:
        self.settings = settings
        self._floor = 0.0 if floor else -math.inf
        self._win = math.log(settings.worse_share / 0.5)  # a shadow win
        self._loss = math.log((1.0 - settings.worse_share) / 0.5)  # a live win (negative)
        self.statistic = 0.0
        self.shadow_wins = 0
        self.live_wins = 0
        # compared items since the statistic left its floor (the shadow win that lifted it first, concordant
        # ones after it too); items while it stays at the floor are in no run (stop 34: before, a stretch of
        # concordant items at the floor was counted, and diluted the drop the run measured: 200 equal items
        # before a poisoning made its 100-point drop read 25 points)
        self._run_items = 0
        self._run_gap = 0  # shadow wins − live wins over them

    def observe(self, live_correct: bool, shadow_correct: bool) -> Verdict:
        self._run_items += 1
        if live_correct == shadow_correct:  # concordant: no evidence either way
            if self.statistic <= self._floor:  # not in a run: it starts when a shadow win lifts the statistic
                self._run_items = self._run_gap = 0
            return Verdict.CONTINUE
        if shadow_correct:
            self.shadow_wins += 1
            self._run_gap += 1
            self.statistic += self._win
        else:
            self.live_wins += 1
            self._run_gap -= 1
            self.statistic = max(self._floor, self.statistic + self._loss)
            if self.statistic <= self._floor:  # the run ended: the next one counts from here
                self._run_items = self._run_gap = 0
        if self.statistic < self.settings.threshold:
            return Verdict.CONTINUE
        return Verdict.WORSE if self.run_drop >= self.settings.min_drop else Verdict.CONTINUE

    @property
    def run_drop(self) -> float:
        """The shadow's accuracy minus the live model's over the current run (a share; 0 before any item)."""
        return self._run_gap / self._run_items if self._run_items else 0.0

    def reset(self) -> None:
        """Start over (after a rollback or a promotion: the shadow changed)."""
        self.statistic = 0.0
        self.shadow_wins = 0
        self.live_wins = 0
        self._run_items = self._run_gap = 0

    def describe(self) -> str:
        return (
            f"CUSUM {self.statistic:.2f} >= h {self.settings.threshold:.2f} nats over discordant pairs "
            f"(shadow wins {self.shadow_wins}, live wins {self.live_wins}, θ₁ {self.settings.worse_share:g}); "
            f"the shadow {100 * self.run_drop:.1f} points above the live model over the run's {self._run_items} "
            f"items (min_drop {100 * self.settings.min_drop:g})"
        )
