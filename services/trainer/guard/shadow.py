"""The last-good model (the shadow): a copy of the model's units holding the weights last promoted, which
predicts the same labelled items as the live model so the two can be compared item by item (:mod:`.cusum`),
and which the live model is rolled back to. It is written only at a promotion or a start, on the record
path's thread, so it needs no lock; its predictions are batched (the items of one consumer batch in one
forward pass, as the learners predict theirs)."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import torch
from torch import nn

from ferret_core.zoo import ZooModel
from services.trainer.unit_weights import UPDATES_KEY, load_snapshot_tensors


def cloned(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A private copy of snapshot tensors (the learner's may be its live master)."""
    return {k: v.detach().clone() for k, v in tensors.items()}


class Shadow:
    """The last-good weights, their model version, and their predictions."""

    def __init__(self, model: ZooModel, tensors: Mapping[str, torch.Tensor]) -> None:
        self._model = ZooModel(
            model.name, tuple(copy.deepcopy(u) for u in model.units), model.input_shape, model.num_classes,
            model.unit_names,
        )  # fmt: skip
        self._net = nn.Sequential(*self._model.units)
        for p in self._net.parameters():
            p.requires_grad_(False)
        self.version = 0
        self._tensors: dict[str, torch.Tensor] = {}
        self.load(tensors)

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Become the model of these snapshot tensors (``model.<unit>.<name>`` and ``engine.updates``)."""
        self._tensors = cloned(tensors)
        self.version = load_snapshot_tensors(self._model, self._tensors)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The last-good weights as snapshot tensors (a copy: the learner may keep them as its master)."""
        out = cloned(self._tensors)
        out[UPDATES_KEY] = torch.tensor(self.version)
        return out

    def predict(self, xs: torch.Tensor) -> list[int]:
        """The predicted classes of a batch of inputs (``[n, *input_shape]``)."""
        with torch.no_grad():
            return [int(c) for c in self._net(xs).argmax(dim=1)]
