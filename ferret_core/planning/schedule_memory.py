"""Planned bytes of a pipeline schedule, from the same per-stage primitives as Ferret's byte model
(:class:`~ferret_core.planning.cost_model.StageGeometry`: |w_j|, autograd's saved elements per item, stage inputs
and outputs; :class:`~ferret_core.planning.memory_model.MemoryModel`'s shared extras: master copy, transient
gradient, optimizer and compensator state, prediction path). The measurement it is checked against is
the engine's meter (:mod:`ferret_core.engine.memory_meter`), never this model.

What the schedule holds at its peak, in elements, per pipeline (a worker slot: one row, or Hanayo's 2W
rows sharing one set of devices) and stage j:

* **activations**: k_j items in flight at stage j, each holding its saved tensors (only the stage input
  under T1) and its stage output, which waits as the next stage's input (nothing waits after the last
  stage); a split backward (zero bubble) also keeps the output gradient |a_j| of each item between its
  B and its W (j < P − 1). k_j is the schedule's cap — P − j per row (1F1B), min(P − j, m) per row and
  m per pipeline inside a synchronous flush group of m micro-batches — unless the stream cannot fill
  it: an item stays in flight at stage j for T_j = Σ_{k≥j} (t̂^f_k + t̂^b_k) (+ t̂^f_k under T1) and a
  pipeline receives one item per S·t^d (S pipelines), so by Little's law at most ⌈T_j / (S·t^d)⌉ of
  them are there at once;
* **weights**: a synchronous schedule holds one version per stage, the master (every row reads the
  version of its group: the replicas share the master's storage); an asynchronous worker holds its
  replica plus the stashes of its in-flight items, 1 + ⌈(k_j − 1)/c^a⌉ versions, at most
  1 + ⌈(P−1−j)/c^a⌉ (PipeDream: one per item in flight; PipeDream-2BW, c^a = m ≥ P − 1: at most
  two); the master is the replica of the worker that updated last, not a copy of its own
  (``clone_replicas=False``, the engine's default);
* **gradients**: a synchronous pipeline's accumulation buffers, |w_j| for each row that holds items of
  the group (min(rows, m)), from the row's first gradient to the flush — a new gradient is summed into
  its buffer within the action, so no separate gradient is held between actions (the model's
  ``transient_gradient`` is left out); an asynchronous worker's c^a − 1 gradients held individually
  until its update (the engine keeps them apart for compensation; 2BW's accumulation) plus the one
  being applied (``transient_gradient``).

Shared: the other extras of :meth:`MemoryModel.breakdown` (optimizer and compensator state, the
prediction path; the Iter-Fisher ring sized by the executed plan's staleness bound, as the engine
allocates it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.plan import Partition, WorkerConfig
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.profile import ModelProfile


@dataclass(frozen=True)
class ScheduleShape:
    """What the byte model needs to know about a schedule."""

    synchronous: bool
    workers: tuple[WorkerConfig, ...]  # the executed rows: c^r per row; c^a drives asynchronous versions
    flush_every: int = 1  # m (synchronous), per pipeline
    split_backward: bool = False
    rows_per_slot: int = 1  # rows that share one pipeline's devices and its m (Hanayo: 2W)


def schedule_memory(
    profile: ModelProfile,
    partition: Partition,
    shape: ScheduleShape,
    settings: MemorySettings,
    arrival_interval: float,
) -> dict[str, int]:
    """Planned bytes by component (elements when ``settings.count_elements``); they sum to the total."""
    geometry = StageGeometry.from_profile(profile, partition)
    outputs = _stage_outputs(profile, partition)
    p = geometry.num_stages
    pipelines = max(1, len([w for w in shape.workers if w.live]) // shape.rows_per_slot)
    residence = _residence(profile, partition)
    parts = {"activations": 0, "weight_versions": 0, "gradients": 0}
    live = [w for w in shape.workers if w.live]
    if shape.synchronous:
        m = shape.flush_every
        for slot in range(pipelines):  # row n belongs to slot n mod S
            rows = [w for w in live if w.index % pipelines == slot]
            used = min(len(rows), m)
            parts["gradients"] += used * geometry.total_weights
            for j in range(p):
                stream = _stream_limit(residence[j], rows[0].recompute, pipelines, arrival_interval)
                in_flight = min(m, used * min(p - j, m), stream)
                parts["activations"] += in_flight * _per_item(geometry, outputs, rows[0], j, shape.split_backward)
    else:
        for worker in live:
            for j in range(p):
                in_flight = min(p - j, _stream_limit(residence[j], worker.recompute, pipelines, arrival_interval))
                parts["activations"] += in_flight * _per_item(geometry, outputs, worker, j, False)
                stashes = math.ceil((in_flight - 1) / worker.accumulation[j])
                parts["weight_versions"] += (1 + stashes) * geometry.weights[j]
                parts["gradients"] += int(worker.accumulation[j] > 1) * geometry.weights[j]  # T2: one buffer
    unit = settings.unit_bytes
    out = {name: value * unit for name, value in parts.items()}
    # the shared extras of the byte model (optimizer and compensator state, prediction path, OCL state,
    # ring, recompute graph); the schedule counts its own versions, activations and gradients above
    extras = {
        name: value
        for name, value in MemoryModel(geometry, profile, settings).breakdown(shape.workers).items()
        if name not in _PER_WORKER
    }
    extras["transient_gradient"] = 0 if shape.synchronous else max(geometry.weights) * unit  # one stage's, at B
    if shape.synchronous:
        out["master"] = geometry.total_weights * unit
    out.update(extras)
    return out


_PER_WORKER = (
    "workers", "versions", "activations", "accumulation_buffers", "master_copy", "transient_gradient",
    "pending_gradients",
)


def _per_item(geometry: StageGeometry, outputs: Sequence[int], worker: WorkerConfig, stage: int, split: bool) -> int:
    """Elements one item in flight holds at ``stage``: saved tensors (the stage input under T1), its output
    waiting for the next stage, and under a split backward its output gradient between B and W."""
    held = geometry.stage_inputs[stage] if worker.recompute else geometry.saved[stage]
    if stage < geometry.num_stages - 1:
        held += outputs[stage] * (2 if split else 1)
    return held


def schedule_bytes(
    profile: ModelProfile,
    partition: Partition,
    shape: ScheduleShape,
    settings: MemorySettings,
    arrival_interval: float,
) -> int:
    """Planned bytes of the schedule (see the module docstring)."""
    return sum(schedule_memory(profile, partition, shape, settings, arrival_interval).values())


def _residence(profile: ModelProfile, partition: Partition) -> list[tuple[float, float]]:
    """Per stage j: (Σ_{k≥j} t̂^f_k + t̂^b_k, Σ_{k≥j} t̂^f_k) — an item's time in flight there without
    waiting, and the recompute's share under T1."""
    out = []
    for j in range(partition.num_stages):
        units = [u for stage in partition.stages[j:] for u in stage]
        out.append((sum(profile.layers[u].t_fb for u in units), sum(profile.layers[u].t_f for u in units)))
    return out


def _stream_limit(residence: tuple[float, float], recompute: bool, pipelines: int, arrival_interval: float) -> int:
    """⌈T_j / (S·t^d)⌉: items one pipeline receives while one of them is in flight at the stage."""
    busy = residence[0] + (residence[1] if recompute else 0.0)
    if arrival_interval <= 0:
        return 1 << 30
    return max(1, math.ceil(busy / (pipelines * arrival_interval) - 1e-9))


def _stage_outputs(profile: ModelProfile, partition: Partition) -> Sequence[int]:
    """Elements of each stage's output (its last unit's activations), per item."""
    return tuple(profile.layers[stage[-1]].activations for stage in partition.stages)
