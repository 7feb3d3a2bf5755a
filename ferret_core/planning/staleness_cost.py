"""The measured cost of staleness: what a gradient applied τ updates late is worth, in fresh items (ours).

The paper's R_F counts trained items (weighted by how long they wait) and knows nothing of staleness, so it
always prefers the N = ⌈(t^f + t^b)/t^d⌉ workers that train every item — whose gradients all arrive τ ≈ N − 1
updates late. The planner's ``accuracy`` objective (:mod:`ferret_core.planning.planner`) weighs that:
each stage's term of R_F is multiplied by d(τ̄_j), the worth of a gradient applied at the stage's mean
staleness τ̄_j (:mod:`ferret_core.planning.expected_staleness`), so a plan adds a worker only when the
items it trains are worth more than the staleness it adds.

d is an **exchange rate between items and staleness**, measured on the stream's head (the services run
the calibration, :mod:`ferret_core.engine.staleness_calibration`, and pass the result in as this value):

* A_fresh(f): the online accuracy of training a fraction f of the items (one in k, τ = 0);
* A_stale(τ): the online accuracy of training every item with every gradient τ updates late;
* d(τ) = the fraction f at which A_fresh(f) = A_stale(τ) (linear between measured fractions, A_fresh made
  non-decreasing in f by pooling adjacent violators): training every item at staleness τ is worth as
  much as training the fraction d(τ) of them fresh — a factor on R_F, which counts items.

d(0) = 1, d is made non-increasing in τ (a running minimum) and lies in [0, 1]; between measured τ it is
linear, beyond the last it continues with the last segment's slope down to 0. The zero cost (d ≡ 1) makes
the accuracy objective the rate objective exactly.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ferret_core.errors import ConfigError


@dataclass(frozen=True)
class StalenessCost:
    """d(τ) at measured staleness points: ``staleness`` strictly increasing from 0, ``worth`` the values
    there (1 at τ = 0, non-increasing, in [0, 1]). ``source`` says what was measured (stream, model, lr,
    seeds); ``measurements`` keeps the accuracies d was derived from (for reports)."""

    staleness: tuple[float, ...]
    worth: tuple[float, ...]
    source: str = ""
    measurements: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        s, w = self.staleness, self.worth
        if len(s) != len(w) or not s:
            raise ConfigError(
                f"a staleness cost needs one worth per staleness point, got {len(s)} points and {len(w)} values"
            )
        if s[0] != 0 or any(b <= a for a, b in itertools.pairwise(s)):
            raise ConfigError(f"staleness points must start at 0 and strictly increase, got {s}")
        if w[0] != 1.0:
            raise ConfigError(f"a fresh gradient (τ = 0) is worth 1 item, got worth {w[0]} at τ = 0")
        if any(not (math.isfinite(x) and 0.0 <= x <= 1.0) for x in w):
            raise ConfigError(f"worth must lie in [0, 1] (fresh items), got {w}")
        if any(b > a for a, b in itertools.pairwise(w)):
            raise ConfigError(
                f"worth must not grow with staleness, got {w} at τ = {s}; build the cost with "
                "StalenessCost.from_accuracies, which makes measured values monotone"
            )

    @classmethod
    def zero(cls) -> StalenessCost:
        """Staleness costs nothing (d ≡ 1): the accuracy objective is then the rate objective."""
        return cls((0.0,), (1.0,), source="zero: staleness costs nothing")

    @property
    def is_zero(self) -> bool:
        return all(x == 1.0 for x in self.worth)

    def discount(self, staleness: float) -> float:
        """d(τ) for a (mean) staleness τ ≥ 0 (see the module docstring)."""
        if not (math.isfinite(staleness) and staleness >= 0):
            raise ConfigError(f"staleness must be a finite number >= 0, got {staleness}")
        s, w = self.staleness, self.worth
        if len(s) == 1:
            return w[0]
        k = bisect.bisect_right(s, staleness) - 1
        k = min(k, len(s) - 2)  # beyond the last point: the last segment's slope
        slope = (w[k + 1] - w[k]) / (s[k + 1] - s[k])
        return min(w[k], max(0.0, w[k] + slope * (staleness - s[k])))

    @classmethod
    def from_accuracies(
        cls,
        fresh: Mapping[float, float],
        stale: Mapping[float, float],
        *,
        source: str = "",
    ) -> StalenessCost:
        """d from measured online accuracies: ``fresh`` maps a trained fraction f ∈ (0, 1] to A_fresh(f)
        (f = 1 required: every item, fresh), ``stale`` maps τ > 0 to A_stale(τ) (module docstring)."""
        if 1.0 not in fresh:
            raise ConfigError(
                f"the calibration needs the accuracy of training every item fresh (fraction 1.0), got fractions "
                f"{sorted(fresh)}"
            )
        if any(not 0 < f <= 1 for f in fresh) or any(t <= 0 for t in stale):
            raise ConfigError(
                f"fractions must lie in (0, 1] and staleness points be > 0, got {sorted(fresh)} and {sorted(stale)}"
            )
        fractions = sorted(fresh)
        curve = _non_decreasing([float(fresh[f]) for f in fractions])
        taus = sorted(stale)
        worth = [1.0]
        for tau in taus:
            worth.append(min(worth[-1], _fraction_at(fractions, curve, float(stale[tau]))))
        measurements = {
            "fresh_oacc": {str(f): float(fresh[f]) for f in fractions},
            "stale_oacc": {str(t): float(stale[t]) for t in taus},
        }
        return cls((0.0, *(float(t) for t in taus)), tuple(worth), source, measurements)

    def to_dict(self) -> dict[str, Any]:
        return {
            "staleness": list(self.staleness),
            "worth": list(self.worth),
            "source": self.source,
            "measurements": dict(self.measurements),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StalenessCost:
        try:
            return cls(
                tuple(float(x) for x in data["staleness"]),
                tuple(float(x) for x in data["worth"]),
                str(data.get("source", "")),
                dict(data.get("measurements", {})),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(
                f"not a staleness cost document (expected 'staleness' and 'worth' lists): {exc}"
            ) from None

    @classmethod
    def load(cls, path: str | Path, what: str | None = None) -> StalenessCost:
        """The cost document at ``path`` (the JSON ``ferret simulate --objective accuracy`` caches); ``what``
        names the option or setting that gave the path, first in an error's message."""
        prefix = f"{what}: " if what else ""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{prefix}staleness cost {str(path)!r}: cannot read a JSON document ({exc})") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{prefix}staleness cost {str(path)!r} must hold a JSON object")
        try:
            return cls.from_dict(data)
        except ConfigError as exc:
            raise ConfigError(f"{prefix}{exc}") from None

def _non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool adjacent violators), equal weights."""
    blocks: list[tuple[float, int]] = []  # (mean, size)
    for v in values:
        blocks.append((v, 1))
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks[-2], blocks[-1]
            blocks[-2:] = [((m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2)]
    return [m for m, n in blocks for _ in range(n)]


def _fraction_at(fractions: list[float], curve: list[float], accuracy: float) -> float:
    """The smallest f with A_fresh(f) = ``accuracy`` on the piecewise-linear curve; 1 above its top, its
    lowest fraction below its bottom."""
    if accuracy >= curve[-1]:
        return 1.0
    if accuracy <= curve[0]:
        return fractions[0]
    for k in range(len(curve) - 1):
        low, high = curve[k], curve[k + 1]
        if low <= accuracy <= high and high > low:
            return fractions[k] + (accuracy - low) / (high - low) * (fractions[k + 1] - fractions[k])
    return 1.0  # unreachable: the curve is non-decreasing and spans the accuracy
