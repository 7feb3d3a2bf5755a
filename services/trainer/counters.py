"""The trainer's stream counters: the one place online accuracy and skips are counted, and what
GetStatus, the metrics endpoint and snapshots report under the same names (``skipped``,
``dead_lettered``, ``labelled_predictions``, …; ``services.trainer.status`` assembles them)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from ferret_core.engine import SkipReason
from ferret_core.metrics import LatencyQuantiles, OnlineAccuracy
from services.trainer.learner import ArrivalOutcome

_TOTALS = (
    "items_received",
    "items_valid",
    "items_dispatched",
    "predictions_published",
    "duplicates_published",
    "labels_joined",
    "replans",
    "pauses",
)
# Keys snapshots written before the names were unified used (read on restore only).
_LEGACY_KEYS = {"oacc_count": "labelled_predictions", "oacc_correct": "correct_predictions", "dlq.": "dead_lettered."}


class StreamCounters:
    """Counters since the start of the stream (restored from a snapshot on restart). Thread-safe: the
    loop thread counts, producer callbacks count deliveries, readers take :attr:`lock`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items_received = 0  # sample records consumed (valid or not)
        self.items_valid = 0  # i: the trainer's own counter of valid arrivals
        self.items_dispatched = 0
        self.predictions_published = 0
        self.duplicates_published = 0
        self.labels_joined = 0
        self.skipped: Counter[str] = Counter()  # by SkipReason (a str enum)
        self.dead_lettered: Counter[str] = Counter()  # by the codec's rejection reason
        self.online = OnlineAccuracy()  # labelled_predictions = count, correct_predictions = correct
        self.latency_ms = LatencyQuantiles(quantiles=(0.5, 0.99), window=20_000)
        self.replans = 0
        self.pauses = 0
        self.last_event_time_ms = 0

    # -- counting ------------------------------------------------------------------------------------
    def next_item(self, event_time_ms: int) -> int:
        """Number a valid arrival (the dispatch index i) and remember its event time."""
        with self.lock:
            item = self.items_valid
            self.items_valid += 1
            self.last_event_time_ms = event_time_ms
            return item

    def count_arrival(self, outcome: ArrivalOutcome, label: int | None) -> float:
        """Score the prediction (when the label is known) and count the decision; the online accuracy
        after it, in percent (DESIGN §3.1: every item is scored at its arrival, skipped or not)."""
        with self.lock:
            if label is not None:
                self.online.update(outcome.predicted_class, label)
            if outcome.skipped is None:
                self.items_dispatched += 1
            else:
                self.skipped[outcome.skipped] += 1
            return self.online.get()

    def count_late_label(self, correct: bool) -> None:
        """A label joined after its prediction (``<prefix>.labels``): it counts toward online accuracy."""
        with self.lock:
            self.labels_joined += 1
            self.online.update(int(correct), 1)

    def count_delivery(self, duplicate: bool, latency_ms: float) -> None:
        with self.lock:
            self.predictions_published += 1
            self.duplicates_published += int(duplicate)
            self.latency_ms.update(latency_ms)

    def add(self, name: str, n: int = 1) -> None:
        """One of the plain totals (``items_received``, ``replans``, ``pauses``, …)."""
        if name not in _TOTALS:
            raise KeyError(f"no counter {name!r}; counters: {', '.join(_TOTALS)}")
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def count_dead_letter(self, reason: str) -> None:
        with self.lock:
            self.dead_lettered[reason] += 1

    # -- snapshots -----------------------------------------------------------------------------------
    def to_snapshot(self) -> dict[str, float | int]:
        with self.lock:
            out: dict[str, float | int] = {name: getattr(self, name) for name in _TOTALS}
            out["labelled_predictions"] = self.online.count
            out["correct_predictions"] = self.online.correct
            out.update({f"skipped.{k}": v for k, v in self.skipped.items()})
            out.update({f"dead_lettered.{k}": v for k, v in self.dead_lettered.items()})
            return out

    def restore(self, values: Mapping[str, float | int]) -> None:
        values = _current_keys(values)
        with self.lock:
            for name in _TOTALS:
                setattr(self, name, int(values.get(name, 0)))
            self.online = OnlineAccuracy.from_dict(
                {
                    "kind": "online_accuracy",
                    "count": int(values.get("labelled_predictions", 0)),
                    "correct": int(values.get("correct_predictions", 0)),
                }
            )
            self.skipped = Counter(
                {_reason(k.removeprefix("skipped.")): int(v) for k, v in values.items() if k.startswith("skipped.")}
            )
            self.dead_lettered = Counter(
                {k.removeprefix("dead_lettered."): int(v) for k, v in values.items() if k.startswith("dead_lettered.")}
            )


def _current_keys(values: Mapping[str, float | int]) -> dict[str, float | int]:
    out: dict[str, float | int] = {}
    for key, value in values.items():
        for old, new in _LEGACY_KEYS.items():
            if key == old or (old.endswith(".") and key.startswith(old)):
                key = new + key[len(old) :]
        out[key] = value
    return out


def _reason(value: str) -> str:
    """The core's SkipReason for a snapshot key (a reason this version does not know stays a string)."""
    try:
        return SkipReason(value)
    except ValueError:
        return value
