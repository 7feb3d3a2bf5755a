"""The process clock's predictions: the current master read straight from shared memory under a pin.

Predictions never wait for training: :meth:`MasterPredictions.predict` pins each stage's current version
(so no update frees its slot while it is read), runs the stages' prediction runners on the caller's
thread, and unpins. Over several hosts a remote stage's version is its follower copy, and how far behind
its owner it was is recorded (:meth:`~ferret_core.engine.processes.hosts.Hosts.observe_prediction`). The
first prediction also records each stage's input and output shape for one item, which the dispatch sends
the stage executors (what each receives from the one before).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ferret_core.engine.processes.dispatch import Dispatch
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.engine.stage_exec import StageProgram, predict_logits
from ferret_core.engine.versions import StageVersion


class MasterPredictions:
    """The top-k classes of arrivals on the current master, with a prediction runner per stage program."""

    def __init__(self, programs: Sequence[StageProgram], dispatch: Dispatch, hosts: Hosts | None, top_k: int) -> None:
        self._runners = [p.runner() for p in programs]
        self._dispatch = dispatch
        self._hosts = hosts
        self._top_k = top_k

    def predict(
        self, stages: Sequence[SharedStageVersions], xs: Sequence[Tensor]
    ) -> tuple[list[list[tuple[int, float]]], int]:
        """The top-k classes of each sample on the current master of ``stages`` (pinned while it runs), and
        its version. The first prediction also records each stage's input and output shape for one item
        (what a stage executor receives from the one before)."""
        pins = [stage.pin_current() for stage in stages]
        try:
            versions = [stage.view(slot, v) for stage, (slot, v) in zip(stages, pins, strict=True)]
            if self._hosts is not None:
                self._hosts.observe_prediction([v for _, v in pins])
            if not self._dispatch.shapes:
                self._dispatch.shapes = self._stage_shapes(versions, xs[0])
            logits = predict_logits(self._runners, versions, torch.stack(list(xs)))
        finally:
            for stage, (slot, _) in zip(stages, pins, strict=True):
                stage.unpin(slot)
        probs = F.softmax(logits.float(), dim=1)
        k = min(self._top_k, probs.shape[1])
        values, classes = torch.sort(probs, dim=1, descending=True, stable=True)
        tops = [
            list(zip(c, v, strict=True)) for c, v in zip(classes[:, :k].tolist(), values[:, :k].tolist(), strict=True)
        ]
        return tops, sum(v for _, v in pins)

    def _stage_shapes(self, versions: Sequence[StageVersion], x: Tensor) -> list[tuple[int, ...]]:
        """Each stage's input shape for one item, then the last stage's output: what a stage executor
        receives from the one before (every item has the shape of the first)."""
        h = x.unsqueeze(0)
        shapes = [tuple(h.shape)]
        for j in range(len(versions)):
            h = predict_logits(self._runners[j : j + 1], versions[j : j + 1], h)
            shapes.append(tuple(h.shape))
        return shapes
