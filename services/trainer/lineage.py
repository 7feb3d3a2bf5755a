"""The lineage a model version counts along.

A model version is the number of optimizer updates applied to the weights, and it goes back when the
weights are replaced out of sequence: a rollback to the last-good weights (the guard), a snapshot restore
(the control plane's, or the restart's), an executor restart from last-good (process executors). The
updates that follow are numbered again from there, so a version number can name two different sets of
weights. A :class:`Lineage` names the line of updates a version counts along: the wall time (ms since the
Unix epoch) at which it began, strictly increasing within the process (two branches in one millisecond get
consecutive values) and moving forward across restarts with the wall clock. ``(model_lineage,
model_version)`` names one set of weights of a trainer instance; every prediction, status, model event,
model-stream update and export carries both (docs/predictions.md, docs/serving.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Lineage:
    """The current lineage of one learner: begun at construction, begun anew by :meth:`branch`."""

    def __init__(self, clock: Callable[[], int] = wall_ms) -> None:
        self._clock = clock
        self.value = clock()

    def branch(self) -> int:
        """Begin a new lineage (the weights were replaced out of sequence); returns it."""
        self.value = max(self._clock(), self.value + 1)
        return self.value
