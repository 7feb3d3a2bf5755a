"""The second rollback rule: **the shadow's concept came back** — a label burst that ended.

While a burst of flipped (or otherwise poisoned) labels lasts, the live model fits it better than the
shadow, exactly as it would fit a genuine change of concept: nothing on those items tells the two apart.
What tells them apart is the end: under a genuine drift the old concept stays gone, after a burst it
returns. The CUSUM of :mod:`.cusum` sees the return only through the shadow's wins in the few items the
live model needs to re-learn, and at lr 0.01 on MNIST those ~50 items leave 3–7 nats of evidence, below
its threshold of 9.2 (``benchmarks/guard/results/flip_evidence.md``). This rule watches the return itself:

1. River's ADWIN (Bifet & Gavaldà 2007, δ 0.002) on the *shadow's* correctness. The shadow's weights are
   fixed between promotions, so a change in its accuracy is a change in the stream, not in the model:
   a detected **fall** means its concept left; a later detected **rise** means it came back.
2. From the rise on — its position estimated within ADWIN's window after the cut by the CUSUM change-point
   estimate (:func:`rise_point`; the items before it are the burst's, where the live model wins by having
   learnt it) — Wald's SPRT on the discordant pairs (shadow right and live wrong, or the reverse; the
   shadow's share θ₁ = ``guard.worse_share`` under the alternative, ½ under the null), with no floor, for
   at most ``horizon`` compared items. It rolls back when its log-likelihood ratio reaches
   ln(1 / ``guard.recurrence_level``): by Ville's inequality the chance that it ever does under equal
   models is at most the level, however long it looks. If the horizon passes first, the live model
   re-learnt what the shadow knows and the watch starts over.
3. At the return the candidates whose weights were taken while the concept was away (trained on the burst)
   are dropped by the learner, and a rollback goes to the newest weights known to predate the fall (a
   candidate on probation taken before :attr:`RecurrenceWatch.fell_from`), not necessarily the last-good:
   the last-good is older by a window and a probation, and on a stream still being learnt that costs
   accuracy (measured in ``benchmarks/guard/README.md``).

A genuine lasting drift never triggers it: the shadow's accuracy falls and stays down until a promotion
replaces the shadow with weights that know the new concept; that rise is tested like a return, and the
live model, the newer one, is not worse than them. (The watch is not restarted at a promotion: a promotion
just before a burst would start a fresh ADWIN inside the burst, blind to the fall; it restarts at a
rollback or a restore.) A stretch of the stream that both models find hard makes both fall and rise
together: concordant pairs, no evidence.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from river import drift

from ferret_core.errors import ConfigError
from services.trainer.guard.cusum import CusumSettings, DiscordantCusum, Verdict

MAX_ITEMS = 1000  # compared items kept to locate the rise in (ADWIN's window after a cut is far shorter)


@dataclass(frozen=True, slots=True)
class Returned:
    """The shadow's concept left at ``fell_at`` (item) and came back, seen at ``item``. ``fell_from``: the
    caller's count of compared items where the fall began, at the latest (weights taken at or before it
    predate the fall; weights taken after it were trained while the concept was away)."""

    item: int
    fell_at: int
    fell_from: int


@dataclass(frozen=True, slots=True)
class Recurrence:
    """Since the shadow's concept came back (:class:`Returned`), the live model is worse than the shadow:
    the SPRT from the rise on reached its threshold at ``item`` after ``items`` compared items, with
    ``shadow_wins`` and ``live_wins`` discordant pairs."""

    returned: Returned
    item: int
    items: int
    shadow_wins: int
    live_wins: int
    llr: float
    threshold: float

    def describe(self) -> str:
        r = self.returned
        return (
            f"the shadow's accuracy fell at item {r.fell_at} and came back at item {r.item}; over the {self.items} "
            f"items since, the shadow won {self.shadow_wins} and the live model {self.live_wins} discordant "
            f"pairs (SPRT {self.llr:.2f} >= {self.threshold:.2f} nats)"
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


class _ReturnTest:
    """Wald's SPRT from the rise on (module docstring, 2): one per return; ``settings`` None (level 0) runs
    out its horizon without a verdict."""

    def __init__(self, returned: Returned, settings: CusumSettings | None) -> None:
        self.returned = returned
        self.items = 0
        self._sprt = None if settings is None else DiscordantCusum(settings, floor=False)

    def observe(self, item: int, live_correct: bool, shadow_correct: bool) -> Recurrence | None:
        self.items += 1
        if self._sprt is None or self._sprt.observe(live_correct, shadow_correct) is Verdict.CONTINUE:
            return None
        t = self._sprt
        return Recurrence(
            self.returned, item, self.items, t.shadow_wins, t.live_wins, t.statistic, t.settings.threshold
        )


class RecurrenceWatch:
    """Feed each compared item's (live correct, shadow correct); :meth:`observe` says when the shadow's
    concept came back (:class:`Returned`) and when, since then, the live model is significantly worse
    (:class:`Recurrence`: roll back). ``level`` 0: never a :class:`Recurrence` (the returns are still
    reported). ``horizon``: compared items the test runs after a return."""

    def __init__(self, level: float, worse_share: float = 0.75, horizon: int = 200) -> None:
        if not 0.0 <= level < 1.0:
            raise ConfigError(f"recurrence level must lie in [0, 1) (0: never roll back), got {level}; e.g. 0.01")
        if horizon < 1:
            raise ConfigError(f"the test's horizon must be >= 1 compared item, got {horizon}")
        self.level = level
        self.horizon = horizon
        # the SPRT's settings (CusumSettings checks worse_share); level 0: no test, so no threshold
        self._settings = CusumSettings(level, worse_share) if level > 0 else None
        self.threshold = math.inf if self._settings is None else self._settings.threshold
        self.reset()

    def reset(self) -> None:
        """Start over: a rollback (the live model is the shadow's weights again) or a restore."""
        self._adwin = drift.ADWIN()  # type: ignore[no-untyped-call]
        self._fell_at: int | None = None
        self._fell_from: int | None = None
        self._test: _ReturnTest | None = None
        self._pairs: deque[tuple[bool, bool]] = deque(maxlen=MAX_ITEMS)

    @property
    def settings(self) -> CusumSettings | None:
        """The SPRT's settings (θ₁ and the level's threshold); None at level 0 (no test)."""
        return self._settings

    @property
    def suspect(self) -> bool:
        """The shadow's concept is away, or came back and the test since is still running: a burst or a
        drift may be under way, so the weights of this time should wait on probation."""
        return self._fell_at is not None or self._test is not None

    @property
    def fell_from(self) -> int | None:
        """While the concept is away or under test: the caller's count of compared items when the fall
        began, at the latest — the start of ADWIN's window after its cut, which still holds some items from
        before the change, so weights taken at or before it predate the fall."""
        if self._test is not None:
            return self._test.returned.fell_from
        return self._fell_from

    def observe(
        self, item: int, live_correct: bool, shadow_correct: bool, position: int
    ) -> Returned | Recurrence | None:
        """One compared item; ``position``: the caller's count of compared items, this one included (what
        :attr:`fell_from` is expressed in)."""
        self._pairs.append((live_correct, shadow_correct))
        before = float(self._adwin.estimation)
        self._adwin.update(float(shadow_correct))  # type: ignore[no-untyped-call]
        if self._test is not None:
            verdict = self._test.observe(item, live_correct, shadow_correct)
            if verdict is not None or self._test.items >= self.horizon:
                self._test = None  # decided: worse (roll back), or not within the horizon (re-learnt)
            return verdict
        if not self._adwin.drift_detected:
            return None
        if float(self._adwin.estimation) <= before:  # a fall
            if self._fell_at is None:
                self._fell_at, self._fell_from = item, position - int(self._adwin.width)
            return None
        if self._fell_at is None or self._fell_from is None:
            return None  # a rise with no fall before it (the start of the stream, an easier stretch)
        returned = Returned(item, self._fell_at, self._fell_from)
        self._fell_at = self._fell_from = None
        self._test = _ReturnTest(returned, self._settings)
        window = list(self._pairs)[-int(self._adwin.width) :]
        for live, shadow in window[rise_point([shadow for _, shadow in window]) :]:  # the items since the rise
            verdict = self._test.observe(item, live, shadow)
            if verdict is not None:
                self._test = None
                return verdict
        return returned
