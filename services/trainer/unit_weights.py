"""The model's units as the learners' common ground: the master copied into them before an engine is
rebuilt, and the snapshot tensors (``model.<unit>.<name>`` plus ``engine.updates`` and ``engine.lineage``,
:mod:`services.trainer.lineage`) both learners write and read, so a snapshot taken on one kind of executor
restores on the other."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch

from ferret_core.engine.wall_clock import Arrival
from ferret_core.zoo import ZooModel
from services.trainer.learner import ArrivalOutcome, ModelDivergedError

UPDATES_KEY = "engine.updates"
LINEAGE_KEY = "engine.lineage"  # the lineage the version counts along (services.trainer.lineage)


def unit_tensor(model: ZooModel, unit: int, name: str) -> torch.Tensor:
    """Unit ``unit``'s parameter or buffer ``name``."""
    module = model.units[unit]
    return module.get_parameter(name) if name in dict(module.named_parameters()) else module.get_buffer(name)


def copy_into_units(model: ZooModel, state: Mapping[tuple[int, str], torch.Tensor]) -> None:
    """Write a master's tensors (keyed by (unit, name), ``unit_state()``) into the model's units."""
    with torch.no_grad():
        for (unit, name), value in state.items():
            unit_tensor(model, unit, name).copy_(value)


def snapshot_tensors(
    state: Mapping[tuple[int, str], torch.Tensor], model_version: int, model_lineage: int = 0
) -> dict[str, torch.Tensor]:
    """A master's tensors as a snapshot stores them, with the model version and its lineage (0: unknown)."""
    out = {f"model.{unit}.{name}": value for (unit, name), value in state.items()}
    out[UPDATES_KEY] = torch.tensor(model_version)
    out[LINEAGE_KEY] = torch.tensor(model_lineage, dtype=torch.int64)
    return out


def load_snapshot_tensors(model: ZooModel, tensors: Mapping[str, torch.Tensor]) -> int:
    """Write a snapshot's ``model.*`` tensors into the model's units; returns its model version."""
    with torch.no_grad():
        for key, value in tensors.items():
            if key.startswith("model."):
                _, unit, name = key.split(".", 2)
                unit_tensor(model, int(unit), name).copy_(value)
    return int(tensors.get(UPDATES_KEY, torch.tensor(0)))


def arrival_outcome(
    arrival: Arrival,
    version_before: int,
    top_k: int,
    largest_weight: Callable[[], float],
    lr: float,
    lineage: int,
) -> ArrivalOutcome:
    """An engine :class:`Arrival` as the record path's outcome; a non-finite prediction is a diverged model
    (``largest_weight``: the master's largest |weight|, for the message; read only on that path)."""
    if not all(math.isfinite(p) for p in (arrival.confidence, *(p for _, p in arrival.top_k))):
        raise ModelDivergedError(arrival.index, largest_weight(), lr)
    return ArrivalOutcome(
        predicted_class=arrival.prediction,
        confidence=arrival.confidence,
        model_version=version_before + arrival.version,  # of the weights that predicted
        skipped=arrival.skipped,
        worker=arrival.worker,
        top_k=arrival.top_k[:top_k],
        model_lineage=lineage,
    )


def largest_weight(state: Mapping[tuple[int, str], torch.Tensor]) -> float:
    """The largest |value| of a master's tensors."""
    return max((float(t.detach().abs().max()) for t in state.values() if t.numel()), default=0.0)
