"""What the trainer's Kafka loop needs from the learning engine.

The loop hands every valid item to :meth:`Learner.arrive`: the master predicts it, then it is dispatched
for training or skipped, and the loop moves on: the learner never blocks the loop (DESIGN §4: no
back-pressure on training). The ``done`` callback reports when the item's outcome is settled (for the
engine learner: predicted and dispatched or skipped); it is what lets offsets be stored only after the
outcome. Snapshots drain the learner first, so their offsets cover exactly the work the weights reflect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch

from ferret_core.plan import Plan


@dataclass(frozen=True)
class Verdict:
    """The training decision for one offered item: dispatched to worker ``worker`` or skipped."""

    dispatched: bool
    worker: int = -1
    reason: str | None = None  # "busy", "worker_removed", "no_label", ... when skipped


@dataclass(frozen=True)
class LearnerPrediction:
    predicted_class: int
    confidence: float
    model_version: int


class Learner(Protocol):
    """The learning engine as the trainer drives it (one loop thread calls ``predict``/``offer``)."""

    def arrive(
        self, item: int, x: torch.Tensor, y: int | None, done: Callable[[], None]
    ) -> tuple[LearnerPrediction, Verdict]:
        """Predict item i (the trainer's counter of valid arrivals) with the master, then dispatch it to
        worker i mod N or skip it; return at once (training goes on in the background)."""

    def drain(self) -> None:
        """Block until every dispatched item's work is reflected in the weights."""

    def apply_plan(self, plan: Plan) -> None:
        """Swap to ``plan`` (called drained): weights carry over, workers and stages are rebuilt."""

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    def stats(self) -> Mapping[str, float]:
        """Cheap counters: ``backward_passes``, ``updates``, ``measured_bytes``, ``peak_bytes``,
        ``mean_staleness`` (optional)."""

    def close(self) -> None: ...
