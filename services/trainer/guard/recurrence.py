"""The second rollback rule: **the shadow's concept came back** — a label burst that ended.

While a burst of flipped (or otherwise poisoned) labels lasts, the live model fits it better than the
shadow, exactly as it would fit a genuine change of concept: nothing on those items tells the two apart.
What tells them apart is the end: under a genuine drift the old concept stays gone, after a burst it
returns. The CUSUM of :mod:`.cusum` sees the return only through the shadow's wins in the few items the
live model needs to re-learn, and at lr 0.01 on MNIST those ~50 items leave 3–7 nats of evidence, below
its threshold (``benchmarks/guard/results/flip_evidence.md``). This rule watches the return itself:

1. River's ADWIN (Bifet & Gavaldà 2007, δ 0.002) on the *shadow's* correctness. The shadow's weights are
   fixed between promotions, so a change in its accuracy is a change in the stream, not in the model:
   a detected **fall** means its concept left; a later detected **rise** means it came back.
2. At that rise, the live model and the shadow are compared on the items since the rise (within ADWIN's
   window after the cut, from the CUSUM estimate of the change point on, at least :data:`MIN_ITEMS`; the
   items before it are the burst's, where the live model wins by having learnt it): an exact one-sided
   sign test on the discordant pairs (McNemar's exact test) at level ``guard.recurrence_level``. If the
   shadow is significantly better, the live model lost what the shadow still knows and is rolled back;
   otherwise (it re-learnt already) the watch starts over.
3. The rollback goes to the newest weights known to predate the fall, not necessarily the last-good: the
   learner keeps passing windows' weights on probation while the shadow's concept is away, and the watch
   says where the fall began at the latest (:attr:`RecurrenceWatch.fell_from`); the learner picks the
   newest candidate taken before it (the last-good if there is none). The last-good is older by a window
   and a probation, and on a stream still being learnt that costs accuracy (measured in
   ``benchmarks/guard/README.md``).

A genuine lasting drift never triggers it: the shadow's accuracy falls and stays down until a promotion
replaces the shadow with weights that know the new concept; that rise is judged like a return and the live
model, the newer one, is not worse than them. (The watch is not restarted at a promotion: a promotion just
before a burst would start a fresh ADWIN inside the burst, blind to the fall; it restarts at a rollback or
a restore.) A stretch of the stream that both models find hard makes both fall and rise together; then
the comparison at the rise finds no significant difference (the live model is the newer one) and nothing
happens.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from river import drift

from ferret_core.errors import ConfigError

MIN_ITEMS = 20  # compared items since the rise at least, for the sign test to have a say
MAX_ITEMS = 1000  # compared items kept for the comparison (ADWIN's window after a cut is far shorter)
MAX_COMPARED = 200  # at most the last so many items after the rise are compared


@dataclass(frozen=True, slots=True)
class Recurrence:
    """The shadow's concept came back at ``item`` after leaving at ``fell_at``; over the ``items`` compared
    since the change point the shadow was right on ``shadow_wins`` of the discordant pairs and the live
    model on ``live_wins``; ``p_value``: the one-sided sign test's."""

    item: int
    fell_at: int
    fell_from: int  # the watch's count of compared items where the fall began, at the latest (module docstring)
    items: int
    shadow_wins: int
    live_wins: int
    p_value: float

    def describe(self) -> str:
        return (
            f"the shadow's accuracy fell at item {self.fell_at} and came back at item {self.item}; over the "
            f"{self.items} items since, the shadow won {self.shadow_wins} and the live model {self.live_wins} "
            f"discordant pairs (sign test p = {self.p_value:.2g})"
        )


def rise_point(outcomes: list[bool]) -> int:
    """Where the accuracy of ``outcomes`` rose: the index k minimising Σ_{i<k} (o_i − mean), the classic
    CUSUM estimate of a single change point (the items before it are below the mean, those after above)."""
    mean = sum(outcomes) / len(outcomes) if outcomes else 0.0
    best, where, running = 0.0, 0, 0.0
    for k, o in enumerate(outcomes):
        running += o - mean
        if running < best:
            best, where = running, k + 1
    return where


def sign_test_p(shadow_wins: int, live_wins: int) -> float:
    """P(X ≥ shadow_wins) for X ~ Binomial(shadow_wins + live_wins, ½): the exact one-sided McNemar test."""
    n = shadow_wins + live_wins
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(shadow_wins, n + 1)) / 2.0**n


class RecurrenceWatch:
    """Feed each compared item's (live correct, shadow correct); :meth:`observe` returns a
    :class:`Recurrence` when the shadow's concept came back and the shadow is significantly better since
    (``level`` 0: never; the watch still says whether the shadow's concept is away)."""

    def __init__(self, level: float) -> None:
        if not 0.0 <= level < 1.0:
            raise ConfigError(f"recurrence level must lie in [0, 1) (0: never roll back), got {level}; e.g. 0.01")
        self.level = level
        self.reset()

    def reset(self) -> None:
        """Start over: a rollback (the live model is the shadow's weights again) or a restore."""
        self._adwin = drift.ADWIN()  # type: ignore[no-untyped-call]
        self._fell_at: int | None = None
        self._fell_from: int | None = None
        self._pairs: deque[tuple[bool, bool]] = deque(maxlen=MAX_ITEMS)

    @property
    def waiting_for_return(self) -> bool:
        """The shadow's accuracy fell and has not come back yet."""
        return self._fell_at is not None

    @property
    def fell_from(self) -> int | None:
        """While :attr:`waiting_for_return`: the caller's count of compared items when the fall began, at
        the latest — the start of ADWIN's window after its cut, which still holds some items
        from before the change, so weights taken at or before it predate the fall."""
        return self._fell_from

    def observe(self, item: int, live_correct: bool, shadow_correct: bool, position: int) -> Recurrence | None:
        """One compared item; ``position``: the caller's count of compared items, this one included (what
        :attr:`fell_from` is expressed in)."""
        self._pairs.append((live_correct, shadow_correct))
        before = float(self._adwin.estimation)
        self._adwin.update(float(shadow_correct))
        if not self._adwin.drift_detected:
            return None
        rose = float(self._adwin.estimation) > before
        if not rose:
            if self._fell_at is None:
                self._fell_at, self._fell_from = item, position - int(self._adwin.width)
            return None
        if self._fell_at is None:
            return None  # a rise with no fall before it (the start of the stream, an easier stretch)
        window = list(self._pairs)[-max(MIN_ITEMS, int(self._adwin.width)) :]
        recent = window[rise_point([shadow for _, shadow in window]) :][-MAX_COMPARED:]
        if len(recent) < MIN_ITEMS:
            recent = window[-MIN_ITEMS:]
        shadow_wins = sum(1 for live, shadow in recent if shadow and not live)
        live_wins = sum(1 for live, shadow in recent if live and not shadow)
        assert self._fell_from is not None
        p_value = sign_test_p(shadow_wins, live_wins)
        found = Recurrence(item, self._fell_at, self._fell_from, len(recent), shadow_wins, live_wins, p_value)
        self._fell_at = self._fell_from = None  # one verdict per return; a later fall starts the next
        return found if found.p_value <= self.level and self.level > 0 else None
