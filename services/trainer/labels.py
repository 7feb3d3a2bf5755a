"""Late labels (DESIGN §4): an item without a label is predicted and skipped for training
(``no_label``); a label that arrives later on ``<prefix>.labels`` joins its prediction by sample id within
a bounded window and counts toward online accuracy (and, with the guard on, toward the comparison of the
live model with its shadow: :meth:`GuardedLearner.late_label`)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LateJoin:
    """A late label joined to its prediction: whether the prediction was ``correct``, and the ``item``
    (the trainer's stream index) it was made for."""

    correct: bool
    item: int


class LateLabelJoin:
    """Remembers the last ``window`` unlabelled predictions (sample id → predicted class and item)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._waiting: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.joined = 0
        self.expired = 0
        self.unmatched = 0

    def remember(self, sample_id: str, predicted_class: int, item: int) -> None:
        if self.window <= 0:
            return
        self._waiting[sample_id] = (predicted_class, item)
        while len(self._waiting) > self.window:
            self._waiting.popitem(last=False)
            self.expired += 1

    def join(self, sample_id: str, label: int) -> LateJoin | None:
        """The earlier prediction, judged; None when the sample is not (or no longer) known."""
        waiting = self._waiting.pop(sample_id, None)
        if waiting is None:
            self.unmatched += 1
            return None
        self.joined += 1
        predicted, item = waiting
        return LateJoin(predicted == label, item)
