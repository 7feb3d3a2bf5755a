"""Streaming metrics: online accuracy, test accuracy, latency quantiles, agm / tagm.

The accumulators follow River's contract (STYLE lesson 8): ``update(...)`` feeds observations,
``get()`` reads the current value, ``merge(other)`` (also ``a + b``) returns a new accumulator equal to
one that saw ``a``'s stream followed by ``b``'s, and ``to_dict()`` / ``from_dict()`` round-trip the
state through JSON-friendly values for snapshots. Accuracies are reported in percent.

``agm`` and ``tagm`` are pure functions of final metric values and memory (DESIGN §3.2).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, SupportsInt

import numpy as np
import torch

from ferret_core.errors import ConfigError

__all__ = [
    "LatencyQuantiles",
    "OnlineAccuracy",
    "TestAccuracy",
    "agm",
    "tagm",
]

Labels = Sequence[int] | np.ndarray | torch.Tensor


def _as_labels(values: Labels, what: str) -> np.ndarray:
    """Class labels as a flat int64 array (accepts lists, numpy arrays and tensors)."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().numpy()
    array = np.asarray(values)
    if array.ndim != 1:
        raise ConfigError(f"{what}: expected a 1-D sequence of class labels, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ConfigError(f"{what}: expected integer class labels, got dtype {array.dtype}")
    return array.astype(np.int64, copy=False)


def _pair(y_pred: Labels, y_true: Labels) -> tuple[np.ndarray, np.ndarray]:
    pred = _as_labels(y_pred, "y_pred")
    true = _as_labels(y_true, "y_true")
    if pred.shape != true.shape:
        raise ConfigError(
            f"y_pred and y_true must have the same length: got {pred.shape[0]} predictions and {true.shape[0]} labels"
        )
    return pred, true


def _percent(correct: int, count: int) -> float:
    return 100.0 * correct / count if count else 0.0


def _check_kind(state: Mapping[str, Any], kind: str) -> None:
    if state.get("kind") != kind:
        raise ConfigError(f"expected a {kind!r} state, got kind {state.get('kind')!r}")


class OnlineAccuracy:
    """Online accuracy oacc(t) = (1/t) Σ_{i≤t} [ŷ_i = y_i] (DESIGN §3.1), in percent.

    Every arriving item is scored by the model at its arrival, before any training on it, including
    items that are then skipped. With ``history=True`` the accumulator also keeps one bit per item so
    that :meth:`curve` can plot oacc over the stream; histories concatenate on :meth:`merge`.
    ``get()`` is 0.0 before the first item (as River's ``Accuracy``).
    """

    def __init__(self, *, history: bool = False) -> None:
        self.history = history
        self.count = 0
        self.correct = 0
        self._bits = bytearray()

    def update(self, y_pred: SupportsInt, y_true: SupportsInt) -> None:
        """Score one prediction against its label."""
        hit = int(int(y_pred) == int(y_true))
        self.count += 1
        self.correct += hit
        if self.history:
            self._bits.append(hit)

    def update_many(self, y_pred: Labels, y_true: Labels) -> None:
        """Score a sequence of predictions in stream order (same as calling :meth:`update` on each)."""
        pred, true = _pair(y_pred, y_true)
        hits = (pred == true).astype(np.uint8)
        self.count += int(hits.size)
        self.correct += int(hits.sum())
        if self.history:
            self._bits.extend(hits.tobytes())

    def get(self) -> float:
        """oacc(t) in percent, t = :attr:`count`."""
        return _percent(self.correct, self.count)

    def curve(self, every: int = 1) -> list[tuple[int, float]]:
        """Points ``(t, oacc(t))`` for t = every, 2·every, …, and the last t (needs ``history=True``)."""
        if every < 1:
            raise ConfigError(f"every must be >= 1, got {every}")
        if not self.history:
            raise ConfigError("curve() needs the per-item history: create OnlineAccuracy(history=True)")
        if not self._bits:
            return []
        cumulative = np.cumsum(np.frombuffer(bytes(self._bits), dtype=np.uint8), dtype=np.int64)
        steps = list(range(every, self.count + 1, every))
        if not steps or steps[-1] != self.count:
            steps.append(self.count)
        return [(t, 100.0 * float(cumulative[t - 1]) / t) for t in steps]

    def merge(self, other: OnlineAccuracy) -> OnlineAccuracy:
        """A new accumulator equal to one that saw ``self``'s stream followed by ``other``'s."""
        if not isinstance(other, OnlineAccuracy):
            raise ConfigError(f"cannot merge OnlineAccuracy with {type(other).__name__}")
        merged = OnlineAccuracy(history=self.history and other.history)
        merged.count = self.count + other.count
        merged.correct = self.correct + other.correct
        if merged.history:
            merged._bits = self._bits + other._bits
        return merged

    __add__ = merge

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly state; the history, if kept, is a string of '0'/'1' characters."""
        state: dict[str, Any] = {"kind": "online_accuracy", "count": self.count, "correct": self.correct}
        if self.history:
            state["history"] = bytes(b + 48 for b in self._bits).decode("ascii")
        return state

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> OnlineAccuracy:
        """Inverse of :meth:`to_dict`."""
        _check_kind(state, "online_accuracy")
        acc = cls(history="history" in state)
        acc.count = int(state["count"])
        acc.correct = int(state["correct"])
        if acc.history:
            bits = str(state["history"])
            if len(bits) != acc.count or set(bits) - {"0", "1"} or bits.count("1") != acc.correct:
                raise ConfigError(
                    f"online_accuracy state: history must be {acc.count} '0'/'1' characters with "
                    f"{acc.correct} ones, got {len(bits)} characters"
                )
            acc._bits = bytearray(c - 48 for c in bits.encode("ascii"))
        if not 0 <= acc.correct <= acc.count:
            raise ConfigError(f"online_accuracy state: expected 0 <= correct <= count, got {dict(state)}")
        return acc

    def __repr__(self) -> str:
        return f"OnlineAccuracy(count={self.count}, oacc={self.get():.2f}%)"


class TestAccuracy:
    """Test accuracy tacc on a held-out split (DESIGN §3.1), in percent; fed with batches."""

    __test__ = False  # not a pytest test class despite its name

    def __init__(self) -> None:
        self.count = 0
        self.correct = 0

    def update(self, y_pred: Labels, y_true: Labels) -> None:
        """Score a batch of predictions (sequences, numpy arrays or tensors of class indices)."""
        pred, true = _pair(y_pred, y_true)
        self.count += int(pred.size)
        self.correct += int((pred == true).sum())

    def get(self) -> float:
        """tacc in percent (0.0 before any batch)."""
        return _percent(self.correct, self.count)

    def merge(self, other: TestAccuracy) -> TestAccuracy:
        """A new accumulator over both accumulators' batches."""
        if not isinstance(other, TestAccuracy):
            raise ConfigError(f"cannot merge TestAccuracy with {type(other).__name__}")
        merged = TestAccuracy()
        merged.count = self.count + other.count
        merged.correct = self.correct + other.correct
        return merged

    __add__ = merge

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "test_accuracy", "count": self.count, "correct": self.correct}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> TestAccuracy:
        _check_kind(state, "test_accuracy")
        acc = cls()
        acc.count = int(state["count"])
        acc.correct = int(state["correct"])
        if not 0 <= acc.correct <= acc.count:
            raise ConfigError(f"test_accuracy state: expected 0 <= correct <= count, got {dict(state)}")
        return acc

    def __repr__(self) -> str:
        return f"TestAccuracy(count={self.count}, tacc={self.get():.2f}%)"


class LatencyQuantiles:
    """Latency quantiles (p50, p99, …), exact over a sliding window of the most recent observations.

    Method: the last ``window`` observations are kept; ``quantile(q)`` sorts them and interpolates
    linearly between order statistics (Hyndman–Fan type 7, numpy's default ``method="linear"``), so it
    equals ``numpy.quantile(last_window, q)`` up to float rounding. ``count``, ``mean`` and ``max`` are
    over *all* observations, not only the window. Merging concatenates the streams (``self`` first) and
    keeps the last ``window`` values, so it equals one accumulator over the concatenated stream.
    Values are in whatever unit the caller feeds (seconds by convention); they must be finite and ≥ 0.
    """

    def __init__(self, quantiles: Sequence[float] = (0.5, 0.9, 0.99), *, window: int = 100_000) -> None:
        if window < 1:
            raise ConfigError(f"window must be >= 1 observations, got {window}")
        qs = tuple(float(q) for q in quantiles)
        bad = [q for q in qs if not 0.0 <= q <= 1.0]
        if bad:
            raise ConfigError(f"quantiles must lie in [0, 1], got {bad}")
        self.quantiles = qs
        self.window = int(window)
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self._values: deque[float] = deque(maxlen=self.window)

    def update(self, value: float) -> None:
        """Add one observation (e.g. a latency in seconds)."""
        x = float(value)
        if not (math.isfinite(x) and x >= 0.0):
            raise ConfigError(f"latency must be a finite number >= 0, got {value!r}")
        self.count += 1
        self.total += x
        self.max = max(self.max, x)
        self._values.append(x)

    def update_many(self, values: Iterable[float]) -> None:
        for value in values:
            self.update(value)

    @property
    def mean(self) -> float:
        """Mean over all observations (0.0 before the first)."""
        return self.total / self.count if self.count else 0.0

    def quantile(self, q: float) -> float:
        """The q-quantile of the window, type-7 linear interpolation (NaN before the first value)."""
        if not 0.0 <= q <= 1.0:
            raise ConfigError(f"quantile must lie in [0, 1], got {q}")
        if not self._values:
            return math.nan
        ordered = sorted(self._values)
        h = (len(ordered) - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (h - lo) * (ordered[hi] - ordered[lo])

    def get(self) -> dict[str, float]:
        """``{"p50": …, "p99": …}`` for the configured quantiles (keys use the percent, e.g. p99.9)."""
        return {_quantile_key(q): self.quantile(q) for q in self.quantiles}

    def merge(self, other: LatencyQuantiles) -> LatencyQuantiles:
        """A new accumulator equal to one that saw ``self``'s stream followed by ``other``'s."""
        if not isinstance(other, LatencyQuantiles):
            raise ConfigError(f"cannot merge LatencyQuantiles with {type(other).__name__}")
        if other.window != self.window or other.quantiles != self.quantiles:
            raise ConfigError(
                f"cannot merge LatencyQuantiles with different settings: window {self.window} vs "
                f"{other.window}, quantiles {self.quantiles} vs {other.quantiles}"
            )
        merged = LatencyQuantiles(self.quantiles, window=self.window)
        merged.count = self.count + other.count
        merged.total = self.total + other.total
        merged.max = max(self.max, other.max)
        merged._values.extend(self._values)
        merged._values.extend(other._values)
        return merged

    __add__ = merge

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "latency_quantiles",
            "quantiles": list(self.quantiles),
            "window": self.window,
            "count": self.count,
            "total": self.total,
            "max": self.max,
            "values": list(self._values),
        }

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> LatencyQuantiles:
        _check_kind(state, "latency_quantiles")
        lat = cls(state["quantiles"], window=int(state["window"]))
        values = [float(v) for v in state["values"]]
        if len(values) > lat.window or len(values) > int(state["count"]):
            raise ConfigError(f"latency_quantiles state: expected at most min(window, count) values, got {len(values)}")
        lat.count = int(state["count"])
        lat.total = float(state["total"])
        lat.max = float(state["max"])
        lat._values.extend(values)
        return lat

    def __repr__(self) -> str:
        parts = ", ".join(f"{k}={v:.6g}" for k, v in self.get().items())
        return f"LatencyQuantiles(count={self.count}, {parts})"


def _quantile_key(q: float) -> str:
    return "p" + f"{100.0 * q:.6g}"


def _log10_memory_ratio(mem_a: float, mem_b: float) -> float:
    for name, mem in (("mem_a", mem_a), ("mem_b", mem_b)):
        if not (isinstance(mem, numbers.Real) and math.isfinite(mem) and mem > 0):
            raise ConfigError(f"{name}: expected a finite memory > 0 (bytes or elements), got {mem!r}")
    return math.log10(float(mem_a) / float(mem_b))


def _check_accuracy(name: str, value: float) -> float:
    if not (isinstance(value, numbers.Real) and math.isfinite(value)):
        raise ConfigError(f"{name}: expected a finite accuracy in percent, got {value!r}")
    return float(value)


def agm(oacc_a: float, oacc_b: float, mem_a: float, mem_b: float) -> float:
    """Online accuracy gain per unit of memory of A over the baseline B (eq. metric-agm).

    The paper writes agm_B(A, t) = log( exp(oacc_A(t) − oacc_B(t)) / (M_A / M_B) ); its tables use
    base-10 logarithms with accuracies in percentage points (DESIGN §3.2), i.e.::

        agm = (oacc_A − oacc_B) / ln 10 − log10(M_A / M_B)

    e.g. MNIST/MNISTNet Oracle 81.14 vs 1-Skip 18.24 at equal memory gives 27.32. Memories may be in
    any unit (bytes or elements) as long as both use the same; they must be > 0.
    """
    diff = _check_accuracy("oacc_a", oacc_a) - _check_accuracy("oacc_b", oacc_b)
    return diff / math.log(10.0) - _log10_memory_ratio(mem_a, mem_b)


def tagm(tacc_a: float, tacc_b: float, mem_a: float, mem_b: float) -> float:
    """Test accuracy gain per unit of memory of A over the baseline B (eq. metric-tagm).

    tagm_B(A) = log( exp(tacc_A − tacc_B) / (M_A / M_B) ), read like :func:`agm` (DESIGN §3.2)::

        tagm = (tacc_A − tacc_B) / ln 10 − log10(M_A / M_B)
    """
    diff = _check_accuracy("tacc_a", tacc_a) - _check_accuracy("tacc_b", tacc_b)
    return diff / math.log(10.0) - _log10_memory_ratio(mem_a, mem_b)
