"""The trainer's stream counters: what GetStatus, the metrics endpoint and snapshots report."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping

from ferret_core.metrics import LatencyQuantiles, OnlineAccuracy


class StreamCounters:
    """Counters since the start of the stream (restored from a snapshot on restart)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items_received = 0  # sample records consumed (valid or not)
        self.items_valid = 0  # i: the trainer's own counter of valid arrivals
        self.items_dispatched = 0
        self.predictions_published = 0
        self.duplicates_published = 0
        self.labels_joined = 0
        self.skipped: Counter[str] = Counter()
        self.dead_lettered: Counter[str] = Counter()
        self.oacc = OnlineAccuracy()
        self.latency_ms = LatencyQuantiles(quantiles=(0.5, 0.99), window=20_000)
        self.replans = 0
        self.pauses = 0
        self.last_event_time_ms = 0

    def to_snapshot(self) -> dict[str, float | int]:
        with self.lock:
            out: dict[str, float | int] = {
                "items_received": self.items_received,
                "items_valid": self.items_valid,
                "items_dispatched": self.items_dispatched,
                "predictions_published": self.predictions_published,
                "duplicates_published": self.duplicates_published,
                "labels_joined": self.labels_joined,
                "oacc_count": self.oacc.count,
                "oacc_correct": self.oacc.correct,
                "replans": self.replans,
                "pauses": self.pauses,
            }
            out.update({f"skipped.{k}": v for k, v in self.skipped.items()})
            out.update({f"dlq.{k}": v for k, v in self.dead_lettered.items()})
            return out

    def restore(self, values: Mapping[str, float | int]) -> None:
        with self.lock:
            for name in (
                "items_received",
                "items_valid",
                "items_dispatched",
                "predictions_published",
                "duplicates_published",
                "labels_joined",
                "replans",
                "pauses",
            ):
                setattr(self, name, int(values.get(name, 0)))
            self.oacc = OnlineAccuracy.from_dict(
                {
                    "kind": "online_accuracy",
                    "count": int(values.get("oacc_count", 0)),
                    "correct": int(values.get("oacc_correct", 0)),
                }
            )
            self.skipped = Counter(
                {k.removeprefix("skipped."): int(v) for k, v in values.items() if k.startswith("skipped.")}
            )
            self.dead_lettered = Counter(
                {k.removeprefix("dlq."): int(v) for k, v in values.items() if k.startswith("dlq.")}
            )
