"""Planned bytes of a pipeline schedule, from the same per-stage primitives as Ferret's byte model
(:class:`~ferret_core.cost_model.StageGeometry`: |w_j|, autograd's saved elements per item, stage inputs
and outputs; :class:`~ferret_core.memory_model.MemoryModel`'s shared extras: master copy, transient
gradient, optimizer and compensator state, prediction path). The measurement it is checked against is
the engine's meter (:mod:`ferret_core.engine.memory`), never this model.

Per row n (a worker of the engine) and stage j, what the schedule holds at its peak, in elements:

* **activations**: k_j items in flight at stage j, each holding its saved tensors (only the stage input
  under T1) and its stage output, which waits as the next stage's input (nothing waits after the last
  stage): k_j = min(P − j, m) for a synchronous schedule (1F1B's warm-up inside a flush group of m),
  P − j for an asynchronous one; a split backward (zero bubble) also keeps the output gradient |a_j| of
  each item between its B and its W (j < P − 1);
* **weights** beyond the master: none for a synchronous schedule (every row reads the one version of
  its group: replicas share the master's storage); for an asynchronous one, worker n's replica plus
  the stashes of its in-flight items, 1 + ⌈(P−1−j)/c^a⌉ versions (PipeDream: one per in-flight item;
  PipeDream-2BW, c^a = m ≥ P − 1: two);
* **gradients**: a synchronous row's accumulation buffer |w_j| from its first gradient to the flush;
  an asynchronous worker's c^a − 1 gradients held individually until its update (the engine keeps
  them apart for compensation; 2BW's accumulation).

Shared: the extras of :meth:`MemoryModel.breakdown` (the Iter-Fisher ring sized by the executed plan's
staleness bound, as the engine allocates it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.cost_model import StageGeometry
from ferret_core.memory_model import MemoryModel, MemorySettings
from ferret_core.plan import Partition, WorkerConfig
from ferret_core.profile import ModelProfile


@dataclass(frozen=True)
class ScheduleShape:
    """What the byte model needs to know about a schedule."""

    synchronous: bool
    workers: tuple[WorkerConfig, ...]  # the executed rows: c^r per row; c^a drives asynchronous versions
    flush_every: int = 1  # m (synchronous)
    split_backward: bool = False


def schedule_memory(
    profile: ModelProfile, partition: Partition, shape: ScheduleShape, settings: MemorySettings
) -> dict[str, int]:
    """Planned bytes by component (elements when ``settings.count_elements``); they sum to the total."""
    geometry = StageGeometry.from_profile(profile, partition)
    outputs = _stage_outputs(profile, partition)
    p = geometry.num_stages
    parts = {"activations": 0, "weight_versions": 0, "gradients": 0}
    for worker in shape.workers:
        if not worker.live:
            continue
        for j in range(p):
            in_flight = min(p - j, shape.flush_every) if shape.synchronous else p - j
            per_item = geometry.stage_inputs[j] if worker.recompute else geometry.saved[j]
            if j < p - 1:
                per_item += outputs[j] * (2 if shape.split_backward else 1)
            parts["activations"] += in_flight * per_item
            if shape.synchronous:
                parts["gradients"] += geometry.weights[j]
            else:
                stashes = math.ceil((p - 1 - j) / worker.accumulation[j])
                parts["weight_versions"] += (1 + stashes) * geometry.weights[j]
                parts["gradients"] += (worker.accumulation[j] - 1) * geometry.weights[j]
    unit = settings.unit_bytes
    out = {name: value * unit for name, value in parts.items()}
    extras = MemoryModel(geometry, profile, settings).breakdown(shape.workers)
    extras.pop("workers", None)
    out.update(extras)
    return out


def schedule_bytes(
    profile: ModelProfile, partition: Partition, shape: ScheduleShape, settings: MemorySettings
) -> int:
    """Planned bytes of the schedule (see the module docstring)."""
    return sum(schedule_memory(profile, partition, shape, settings).values())


def _stage_outputs(profile: ModelProfile, partition: Partition) -> Sequence[int]:
    """Elements of each stage's output (its last unit's activations), per item."""
    return tuple(profile.layers[stage[-1]].activations for stage in partition.stages)
