"""What rebuilds a learned model away from the trainer: the model spec as the zoo / BYO registry names it
(``mnistnet``, ``examples.custom_cnn:build``), the per-sample input shape, the classes and the trainer's
input contract (range and normaliser), so serving decodes inputs exactly as the trainer's record path does.

The weights are the units' tensors under ``<unit>.<name>``, the state-dict keys of
``ZooModel.as_sequential()``: a plain ``nn.Sequential`` of the rebuilt units loads them with
``load_state_dict(strict=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from ferret_core.zoo import ZooModel
from services.models import build_model_for, check_model_spec
from services.serving.errors import ExportError

if TYPE_CHECKING:  # not at run time: loading an export must not import the Kafka package (its client)
    from services.kafka.record_codec import Normaliser, SampleDecoder

# services.kafka.record_codec's DEFAULT_INPUT_RANGE and NORMALISERS (a unit test keeps them equal)
DEFAULT_INPUT_RANGE = (-1000.0, 1000.0)
NORMALISERS = ("none", "clip", "minmax")
MODEL_PREFIX = "model."  # the snapshot's and the learners' names of the master's tensors
VERSION_KEY = "engine.updates"  # the snapshot's model version tensor
LINEAGE_KEY = "engine.lineage"  # the lineage that version counts along (services.trainer.lineage)


@dataclass(frozen=True)
class ModelCard:
    """The model's identity and input contract (module docstring)."""

    model: str
    input_shape: tuple[int, ...]
    num_classes: int
    input_range: tuple[float, float] = DEFAULT_INPUT_RANGE
    input_normaliser: Normaliser = "none"

    def __post_init__(self) -> None:
        check_model_spec(self.model)
        if not self.input_shape or any(s < 1 for s in self.input_shape) or self.num_classes < 1:
            raise ExportError(
                f"model card of {self.model!r}: expected a positive input shape and >= 1 classes, got "
                f"{list(self.input_shape)} and {self.num_classes}"
            )
        if self.input_normaliser not in NORMALISERS:
            raise ExportError(f"model card: normaliser {self.input_normaliser!r}, expected one of {NORMALISERS}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "input_shape": list(self.input_shape),
            "num_classes": self.num_classes,
            "input_range": list(self.input_range),
            "input_normaliser": self.input_normaliser,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelCard:
        try:
            low, high = (float(v) for v in data.get("input_range", DEFAULT_INPUT_RANGE))
            normaliser = str(data.get("input_normaliser", "none"))
            if normaliser not in NORMALISERS:
                raise ValueError(f"input_normaliser {normaliser!r}, expected one of {NORMALISERS}")
            return cls(
                model=str(data["model"]),
                input_shape=tuple(int(s) for s in data["input_shape"]),
                num_classes=int(data["num_classes"]),
                input_range=(low, high),
                input_normaliser=cast("Normaliser", normaliser),  # checked against NORMALISERS above
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ExportError(f"model card is malformed ({exc}): expected model, input_shape, num_classes") from exc

    def decoder(self) -> SampleDecoder:
        """The trainer's decoder for this contract (serving validates and normalises inputs with it)."""
        from services.kafka.record_codec import SampleDecoder

        return SampleDecoder(
            self.input_shape, self.num_classes, input_range=self.input_range, normaliser=self.input_normaliser
        )

    def build(self) -> ZooModel:
        """The model's units, freshly built (weights to be loaded by :func:`rebuild`)."""
        return build_model_for(self.model, input_shape=self.input_shape, num_classes=self.num_classes, seed=0)


def unit_weights(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A snapshot's / learner's ``model.<unit>.<name>`` tensors as ``<unit>.<name>`` (contiguous CPU copies)."""
    return {
        name.removeprefix(MODEL_PREFIX): t.detach().cpu().contiguous()
        for name, t in tensors.items()
        if name.startswith(MODEL_PREFIX)
    }


def model_version(tensors: Mapping[str, torch.Tensor]) -> int:
    """The optimizer updates a learner's / snapshot's tensors reflect (``engine.updates``; 0 when absent)."""
    value = tensors.get(VERSION_KEY)
    return 0 if value is None else int(value)


def model_lineage(tensors: Mapping[str, torch.Tensor]) -> int:
    """The lineage the version counts along (``engine.lineage``; 0 when absent: written before lineages)."""
    value = tensors.get(LINEAGE_KEY)
    return 0 if value is None else int(value)


def rebuild(card: ModelCard, weights: Mapping[str, torch.Tensor]) -> nn.Sequential:
    """The card's model with ``weights`` (``<unit>.<name>``) loaded strictly, in eval mode, no gradients."""
    sequential = card.build().as_sequential()
    try:
        sequential.load_state_dict(dict(weights), strict=True)
    except RuntimeError as exc:
        raise ExportError(
            f"the weights do not fit model {card.model!r} with input {list(card.input_shape)} and "
            f"{card.num_classes} classes: {str(exc).splitlines()[0]}"
        ) from exc
    sequential.eval()
    for parameter in sequential.parameters():
        parameter.requires_grad_(False)
    return sequential


def predict_probabilities(model: nn.Module, xs: torch.Tensor) -> torch.Tensor:
    """Softmax over the classes of a batch, in float32, as the trainer's master predicts."""
    with torch.no_grad():
        logits = model(xs)
    return torch.softmax(logits if logits.dtype == torch.float32 else logits.float(), dim=1)
