"""Which consumed offsets are finished, per partition, so offsets are stored only after the outcome.

An offset is *finished* when its prediction is published and its training work is reflected in the
weights (or it was skipped, dead-lettered, or is a label). ``resume_offsets()`` gives, per partition, the
smallest offset that is not finished: what a restart must read again (DESIGN §4 "Offsets and snapshots").
``predicted_through`` remembers, per partition, one past the highest offset already predicted, so a
restarted trainer can flag re-emitted predictions as duplicates; offsets at or beyond it whose outcome an
earlier owner already published (found by :func:`services.trainer.outcomes.scan_outcomes`) are
duplicates too (:meth:`OffsetLedger.published_before`).
"""

from __future__ import annotations

import threading
from collections import OrderedDict


class OffsetLedger:
    """Thread-safe: the loop adds offsets, engine threads finish them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, OrderedDict[int, bool]] = {}
        self._next: dict[int, int] = {}  # per partition: one past the highest offset seen
        self.predicted_through: dict[int, int] = {}
        self._restored_through: dict[int, int] = {}
        self._published: dict[int, set[int]] = {}  # offsets with an outcome from an earlier owner

    def add(self, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.setdefault(partition, OrderedDict())[offset] = False
            self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def starts_at(self, partition: int, offset: int) -> None:
        """Consumption of ``partition`` starts at ``offset`` (an assignment): what a snapshot taken before
        any record of it arrives resumes from."""
        with self._lock:
            if partition not in self._next:
                self._next[partition] = offset

    def finish(self, partition: int, offset: int) -> None:
        with self._lock:
            pending = self._pending.get(partition)
            if pending is None or offset not in pending:
                return
            pending[offset] = True
            while pending and pending[next(iter(pending))]:  # the oldest pending offset is finished
                pending.popitem(last=False)

    def mark_predicted(self, partition: int, offset: int) -> None:
        with self._lock:
            self.predicted_through[partition] = max(self.predicted_through.get(partition, 0), offset + 1)

    def is_duplicate(self, partition: int, offset: int) -> bool:
        """True for an offset a previous run (restored from a snapshot) had already predicted."""
        with self._lock:
            return offset < self._restored_through.get(partition, 0) or offset in self._published.get(partition, ())

    def published_before(self, partition: int, offsets: set[int]) -> None:
        """These offsets of ``partition`` already have an outcome (an earlier run or owner published it)."""
        with self._lock:
            self._published.setdefault(partition, set()).update(offsets)

    def restore(self, predicted_through: dict[int, int]) -> None:
        with self._lock:
            self._restored_through = dict(predicted_through)
            self.predicted_through = dict(predicted_through)

    def known_predicted(self, partition: int, offset: int) -> None:
        """Offsets below ``offset`` were predicted by an earlier run (e.g. the group's committed offset:
        committed offsets are stored only after their prediction was delivered)."""
        with self._lock:
            current = self._restored_through.get(partition, 0)
            self._restored_through[partition] = max(current, offset)
            self.predicted_through[partition] = max(self.predicted_through.get(partition, 0), offset)

    def resume_offsets(self) -> dict[int, int]:
        """Per partition: the smallest unfinished offset, else one past the highest seen."""
        with self._lock:
            out = {}
            for partition, nxt in self._next.items():
                pending = self._pending.get(partition)
                out[partition] = next(iter(pending)) if pending else nxt
            return out

    def unfinished(self) -> int:
        with self._lock:
            return sum(len(p) for p in self._pending.values())

    def forget(self, partitions: list[int]) -> None:
        """Drop partitions this replica no longer owns (a rebalance): their next owner reads what is
        unfinished again, from the committed offset."""
        with self._lock:
            for partition in partitions:
                self._pending.pop(partition, None)
                self._next.pop(partition, None)
                self._published.pop(partition, None)
                self._restored_through.pop(partition, None)
                self.predicted_through.pop(partition, None)

    def unfinished_in(self, partition: int) -> int:
        with self._lock:
            return len(self._pending.get(partition, ()))
