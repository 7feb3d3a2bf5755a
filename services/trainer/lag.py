"""How far behind the stream the trainer is, per assigned sample partition.

- **Caught up**: the consumer reports the end of a partition (``enable.partition.eof``) once it has read
  everything there is; until the next record of that partition arrives its lag is 0 items and 0 s. An idle
  stream therefore reports 0, not a growing age.
- **Items behind** otherwise: the broker's high watermark minus the next offset to consume, from the
  watermarks librdkafka caches from fetch responses (no extra request). Real Kafka's are exact; a watermark
  below what was already consumed is implausible (the embedded broker's ListOffsets answers count batches,
  DESIGN §5) and reported as unknown (``-1``) rather than as a number.
- **Seconds behind**: for each partition that is behind, now minus the event time of the newest consumed
  record; the status reports the largest.

The loop thread feeds it (records, end-of-partition events, watermarks every store interval); the status
reads :meth:`PartitionLag.reading` from any thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from services.kafka.record_codec import now_ms

UNKNOWN = -1


@dataclass(frozen=True)
class LagReading:
    """``items``: the sum over partitions whose lag is known; ``by_partition``: items per partition (-1:
    unknown); ``seconds``: the age of the newest consumed item of the partition furthest behind."""

    items: int = 0
    seconds: float = 0.0
    by_partition: dict[int, int] = field(default_factory=dict)


class PartitionLag:
    def __init__(self, clock_ms: Callable[[], int] = now_ms) -> None:
        self._lock = threading.Lock()
        self._clock_ms = clock_ms
        self._next: dict[int, int] = {}  # next offset to consume
        self._high: dict[int, int] = {}  # high watermark (-1: unknown)
        self._caught_up: dict[int, bool] = {}
        self._event_ms: dict[int, int] = {}  # event time of the newest consumed record

    def assigned(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._caught_up.setdefault(p, False)
                self._high.setdefault(p, UNKNOWN)

    def revoked(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                for table in (self._next, self._high, self._caught_up, self._event_ms):
                    table.pop(p, None)

    def consumed(self, partition: int, offset: int, event_time_ms: int | None) -> None:
        with self._lock:
            self._next[partition] = offset + 1
            self._caught_up[partition] = False
            if event_time_ms:
                self._event_ms[partition] = event_time_ms

    def end_of_partition(self, partition: int, offset: int) -> None:
        """The consumer read partition ``partition`` up to ``offset`` (its end, for now)."""
        with self._lock:
            self._next[partition] = max(self._next.get(partition, 0), offset)
            self._caught_up[partition] = True

    def offsets(self, partition: int, position: int, high: int) -> None:
        """The consumer's position (next offset to consume) and the cached high watermark (< 0: unknown)."""
        with self._lock:
            if partition not in self._caught_up:
                return
            if position >= 0:
                self._next[partition] = max(self._next.get(partition, 0), position)
            self._high[partition] = high if high >= 0 else UNKNOWN

    def reading(self) -> LagReading:
        with self._lock:
            now = self._clock_ms()
            by_partition: dict[int, int] = {}
            seconds = 0.0
            for p, caught_up in self._caught_up.items():
                if caught_up:
                    by_partition[p] = 0
                    continue
                high, nxt = self._high.get(p, UNKNOWN), self._next.get(p)
                if high == UNKNOWN or nxt is None or high < nxt:  # not known yet, or implausible
                    by_partition[p] = UNKNOWN
                else:
                    by_partition[p] = high - nxt
                if p in self._event_ms:
                    seconds = max(seconds, (now - self._event_ms[p]) / 1000)
            items = sum(n for n in by_partition.values() if n > 0)
            return LagReading(items, max(0.0, seconds), by_partition)
