"""What the planner plans with when an OCL algorithm changes Ferret's unit of work (docs/ocl.md).

Under ER/MIR a pipeline step is a micro-batch (the item plus its replayed items), under LwF every stage
forwards twice (teacher beside student), under MIR the worker first runs the retrieval's whole-model
passes. :func:`planning_profile` turns the profile into one whose per-unit times are those of the
algorithm's usual step (so the planner's t^f, t^b and worker count N follow it), and
:func:`planning_memory` makes the byte model count the step's activations (``micro_batch``) and the
algorithm's state (replay buffer, teacher copy, MAS importances and anchor; DESIGN §3.8). The arrival
interval stays the stream's: pass it to the planner explicitly.
"""

from __future__ import annotations

import dataclasses

from ferret_core.engine.steps import Footprint
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.profile import ModelProfile
from ferret_core.schedule.step_shape import StepShape


def planning_profile(profile: ModelProfile, shape: StepShape) -> ModelProfile:
    """``profile`` with each unit's t_f = forward_passes·t_f(batch) (the first unit also carrying the
    overhead passes) and t_b = t_b(batch); sizes stay per item."""
    if shape.batch == 1 and shape.forward_passes == 1 and not shape.overhead:
        return profile
    times = profile.layer_times(shape.batch)
    overhead = 0.0
    for batch, with_backward in shape.overhead:
        passes = profile.layer_times(batch)
        overhead += sum(t_f for t_f, _ in passes) + (sum(t_b for _, t_b in passes) if with_backward else 0.0)
    layers = tuple(
        dataclasses.replace(
            layer, t_f=shape.forward_passes * t_f + (overhead if i == 0 else 0.0), t_b=t_b, batch_times=()
        )
        for i, (layer, (t_f, t_b)) in enumerate(zip(profile.layers, times, strict=True))
    )
    meta = {**profile.meta, "batch_size": 1, "planned_step": dataclasses.asdict(shape)}
    return ModelProfile(profile.model, profile.input_shape, layers, profile.device, profile.dtype, profile.time_unit,
                        meta)


def planning_memory(memory: MemorySettings, footprint: Footprint, shape: StepShape) -> MemorySettings:
    """``memory`` counting a step of ``shape.batch`` items and the algorithm's ``footprint``."""
    return dataclasses.replace(
        memory,
        micro_batch=shape.batch,
        replay_items=footprint.replay_items,
        teacher_copy=footprint.teacher_copy,
        importances=footprint.importances,
    )
