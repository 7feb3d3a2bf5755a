"""Passes of the whole model on the current masters, outside the executors: the master's predictions of
arrivals and test splits (:class:`Predictor`), and the OCL algorithm's view of the model
(:class:`MasterView`).

Each has stage runners of its own (a runner is not thread-safe: the executors, the predictions and the
algorithm never share one) and reads the masters through the pipeline's ``masters`` (taken under the
masters' guard, so an in-place update never writes a version a pass is reading; see
:mod:`ferret_core.engine.stage_update`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ferret_core.engine.stage_exec import StageProgram, predict_logits
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError
from ferret_core.metrics import TestAccuracy

Masters = Callable[[], tuple[StageVersion, ...]]

# Up to this many classes a prediction's top k is sorted in Python from one read-out of the probabilities
# (stable, as torch.sort(stable=True): ties keep the lower class first): fewer torch calls on the record
# path's thread, each of which hands the GIL to the training thread and waits to get it back.
SORT_IN_PYTHON = 64


class Predictor:
    """The master's predictions (no grad; the caller counts them), on the prediction runners."""

    def __init__(self, programs: Sequence[StageProgram], masters: Masters) -> None:
        self.runners = [p.runner() for p in programs]
        self._masters = masters

    def predict(self, x: Tensor) -> int:
        """The master's prediction for one sample."""
        return self.predict_with_confidence(x)[0]

    def predict_with_confidence(self, x: Tensor) -> tuple[int, float]:
        """The master's predicted class for one sample and its softmax probability."""
        return self.predict_top_k(x, 1)[0]

    def predict_top_k(self, x: Tensor, k: int) -> tuple[tuple[int, float], ...]:
        """The master's ``k`` most probable classes for one sample as (class, softmax probability), most
        probable first (all classes when the model has fewer than ``k``). Ties keep the lower class first,
        so entry 0 is the argmax, the predicted class."""
        return self.predict_top_k_batch(x.unsqueeze(0), k)[0]

    def predict_top_k_batch(
        self, xs: Tensor, k: int, versions: Sequence[StageVersion] | None = None
    ) -> list[tuple[tuple[int, float], ...]]:
        """:meth:`predict_top_k` for every sample of the batch ``xs`` (first dimension), in one forward
        pass on the same master version (``versions``: the masters the caller took with the pipeline's
        ``masters``, to know which version predicted; default: the current ones): how the wall clock
        predicts arrivals that queued up together (a consumer batch after a pause) without each waiting for
        the previous one's forward."""
        if k < 1:
            raise ConfigError(f"top-k needs k >= 1, got {k}")
        logits = predict_logits(self.runners, self._masters() if versions is None else versions, xs)
        probs = torch.softmax(logits if logits.dtype == torch.float32 else logits.float(), dim=1)  # one call less
        n = min(k, probs.shape[1])
        if probs.shape[1] <= SORT_IN_PYTHON:  # few classes: one read-out, Python's stable sort
            rows: list[list[float]] = probs.tolist()
            if all(math.isfinite(sum(row)) for row in rows):  # a NaN row (a diverged model) sorts as torch does
                return [
                    tuple((c, row[c]) for c in sorted(range(len(row)), key=lambda c: -row[c])[:n]) for row in rows
                ]
        values, classes = torch.sort(probs, dim=1, descending=True, stable=True)
        return [
            tuple(zip(c, v, strict=True)) for c, v in zip(classes[:, :n].tolist(), values[:, :n].tolist(), strict=True)
        ]

    def evaluate(self, x: Tensor, y: Tensor, *, batch: int = 1000) -> float:
        """Test accuracy (percent) of the master on a labelled split, in batches."""
        acc = TestAccuracy()
        for start in range(0, len(y), batch):
            logits = predict_logits(self.runners, self._masters(), x[start : start + batch])
            acc.update(logits.argmax(dim=1).cpu(), y[start : start + batch])
        return acc.get()


class MasterView:
    """:class:`~ferret_core.engine.steps.ModelView` over a pipeline's masters, with runners of its own (the
    algorithm's whole-model passes)."""

    def __init__(self, programs: Sequence[StageProgram], masters: Masters, lr: float) -> None:
        self._runners = [p.runner() for p in programs]
        self._masters = masters
        self._lr = lr

    @property
    def lr(self) -> float:
        return self._lr

    def masters(self) -> tuple[StageVersion, ...]:
        return self._masters()

    def logits(self, x: Tensor, versions: Sequence[StageVersion] | None = None) -> Tensor:
        return predict_logits(self._runners, self.masters() if versions is None else versions, x)

    def gradients(
        self, x: Tensor, objective: Callable[[Tensor], Tensor], versions: Sequence[StageVersion] | None = None
    ) -> list[tuple[Tensor, ...]]:
        chosen = self.masters() if versions is None else tuple(versions)
        leaves = [tuple(p.detach().requires_grad_(True) for p in v.params) for v in chosen]
        with torch.enable_grad():
            out = x
            for runner, version, params in zip(self._runners, chosen, leaves, strict=True):
                device = params[0].device if params else out.device
                out = runner(params, version.buffers, out.to(device, non_blocking=True))
            flat = [p for stage in leaves for p in stage]
            grads = torch.autograd.grad(objective(out), flat, allow_unused=True, materialize_grads=True)
        out_grads: list[tuple[Tensor, ...]] = []
        start = 0
        for stage in leaves:
            out_grads.append(tuple(grads[start : start + len(stage)]))
            start += len(stage)
        return out_grads
