"""The recall test: when the shadow's concept comes back (:mod:`.recurrence`), the live model and the weights a
rollback would return to both predict labelled items kept from **before** the concept left, and Wald's SPRT on
their discordant pairs decides at once whether the live model is worse.

Why a second source of evidence. The recurrence rule's SPRT sees only the items that arrive after the return,
and a live model trained on a burst of flipped labels re-learns the true ones from those same items: at lr
0.01 on MNIST it is mostly right again ~5–25 items after a 200-item flip ended, so on 2 seeds of 3 the rule
never gathered its 4.6 nats and the flip-trained weights stayed (``benchmarks/guard/README.md``, stop 38).
The items from before the fall are of the concept that came back (that is what the return says), they are
labelled, and they are all there at the moment of the return: a live model that fitted the burst is wrong on
many of them where the pre-fall weights are right, before it has had time to learn back.

The test is the recurrence rule's (the same θ₁ = ``guard.worse_share``, the same threshold ln(1 /
``guard.recurrence_level``), no floor): by Ville's inequality, under equal models the chance that the SPRT
ever crosses the threshold over the kept pairs is at most the level. It compares exactly the two models a
rollback would swap, the live weights and the newest weights known to predate the fall, on the same items.

A lasting drift never reaches it (the concept does not come back: no return is seen). A stretch of the
stream that both models found hard (ADWIN saw the shadow fall and rise on a clean stream) reaches it with a
live model that learnt the same concept further: no more wrong on the kept items than the older weights, so
no evidence. What it costs: ``guard.recall_items`` inputs kept (up to twice as many: the fall is seen up to
ADWIN's window after it began, and the items since are the burst's, dropped then), and two forward passes
over them at each return.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ferret_core.errors import ConfigError
from services.trainer.guard.cusum import CusumSettings, DiscordantCusum, Verdict


@dataclass(frozen=True, slots=True)
class Recalled:
    """The recall test's outcome over ``items`` kept items: the target (the weights a rollback returns to)
    was right where the live model was wrong ``target_wins`` times, the reverse ``live_wins`` times; ``worse``
    when the SPRT reached its threshold (after ``decided_after`` items)."""

    items: int
    target_wins: int
    live_wins: int
    llr: float
    threshold: float
    worse: bool
    decided_after: int | None

    def describe(self) -> str:
        return (
            f"on the {self.items} labelled items kept from before the fall, the weights from before it won "
            f"{self.target_wins} and the live model {self.live_wins} discordant pairs (recall SPRT {self.llr:.2f} "
            f"{'>=' if self.worse else '<'} {self.threshold:.2f} nats"
            + (f", after {self.decided_after} items)" if self.decided_after is not None else ")")
        )


class RecallBuffer:
    """The last labelled items compared while the shadow's concept was present: (position, x, y), where the
    position is the guard's count of compared items. ``capacity``: items a test uses; twice that are kept."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ConfigError(f"recall_items must be >= 0 (0: no recall test), got {capacity}; e.g. 256")
        self.capacity = capacity
        self._kept: deque[tuple[int, torch.Tensor, int]] = deque(maxlen=2 * capacity)

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, position: int, x: torch.Tensor, y: int) -> None:
        if self.capacity:
            self._kept.append((position, x, y))

    def drop_after(self, position: int) -> None:
        """Forget the items compared after ``position`` (the concept had left by then: the burst's items)."""
        while self._kept and self._kept[-1][0] > position:
            self._kept.pop()

    def clear(self) -> None:
        self._kept.clear()

    def before(self, position: int) -> tuple[torch.Tensor, list[int]] | None:
        """The newest ``capacity`` items compared at or before ``position``, stacked; None when there are none."""
        chosen = [(x, y) for p, x, y in self._kept if p <= position][-self.capacity :]
        if not chosen:
            return None
        return torch.stack([x for x, _ in chosen]), [y for _, y in chosen]


def recall_test(
    live: Sequence[int], target: Sequence[int], labels: Sequence[int], settings: CusumSettings
) -> Recalled:
    """Wald's SPRT (no floor) over the pairs (live correct, target correct) of the kept items, in the order
    they were kept, stopping at the first crossing (module docstring)."""
    if not len(live) == len(target) == len(labels):
        raise ValueError(f"expected as many predictions as labels, got {len(live)}, {len(target)}, {len(labels)}")
    sprt = DiscordantCusum(settings, floor=False)
    for n, (a, b, y) in enumerate(zip(live, target, labels, strict=True), start=1):
        if sprt.observe(a == y, b == y) is Verdict.WORSE:
            return Recalled(len(labels), sprt.shadow_wins, sprt.live_wins, sprt.statistic, settings.threshold, True, n)
    return Recalled(len(labels), sprt.shadow_wins, sprt.live_wins, sprt.statistic, settings.threshold, False, None)
