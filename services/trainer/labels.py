"""Late labels (DESIGN §4): an item without a label is predicted and skipped for training
(``no_label``); a label that arrives later on ``<prefix>.labels`` joins its prediction by sample id within
a bounded window and counts toward online accuracy only."""

from __future__ import annotations

from collections import OrderedDict


class LateLabelJoin:
    """Remembers the last ``window`` unlabelled predictions (sample id → predicted class)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._waiting: OrderedDict[str, int] = OrderedDict()
        self.joined = 0
        self.expired = 0
        self.unmatched = 0

    def remember(self, sample_id: str, predicted_class: int) -> None:
        if self.window <= 0:
            return
        self._waiting[sample_id] = predicted_class
        while len(self._waiting) > self.window:
            self._waiting.popitem(last=False)
            self.expired += 1

    def join(self, sample_id: str, label: int) -> bool | None:
        """Whether the earlier prediction was correct; None when the sample is not (or no longer) known."""
        predicted = self._waiting.pop(sample_id, None)
        if predicted is None:
            self.unmatched += 1
            return None
        self.joined += 1
        return predicted == label
