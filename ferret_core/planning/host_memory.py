"""A plan's bytes per host, for a pipeline whose stages live on several hosts (ours, not in the paper).

The paper plans one device: M_F ≤ budget. Over several hosts (docs/processes.md "Several hosts") each host
runs out of its own memory, so a plan that fits the job's total can still overflow the host that owns the
heaviest stage. Where the bytes live, with the stages placed by :func:`~ferret_core.planning.placement.stage_owners`:

* the **owner of stage j** holds what :meth:`~ferret_core.planning.memory_model.MemoryModel.stage_breakdown`
  puts at j: every worker's version slots of j and their activations there, j's shared slots, its
  accumulation buffers, pending gradients, optimizer and compensator state;
* **rank 0**, the record path's host, holds what belongs to no stage (admission queues, the prediction
  path) and a follower copy of every stage it does not own: :data:`FOLLOWER_SLOTS` slots of the stage's
  weights and their slot table (the coordinator predicts with them, so predictions never wait for the
  network).

The job's budget (``trainer.budget_bytes``) stays the one-host model's total, as the paper's M_F; a
:class:`HostBudget` bounds every host's bytes as well, and the planner keeps only configurations that fit
both (:class:`~ferret_core.planning.planner.Planner`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.errors import ConfigError
from ferret_core.plan import WorkerConfig
from ferret_core.planning.memory_model import SLOT_TABLE_ENTRY_BYTES, MemoryModel
from ferret_core.planning.placement import stage_owners

# a follower's slots on rank 0: the current copy, a prediction's pin, master_state's pin, the one written
# (the engine's ferret_core.engine.processes.hosts allocates this many)
FOLLOWER_SLOTS = 4


@dataclass(frozen=True)
class HostBudget:
    """Every host's memory budget (``budget_bytes``, the same for each; None: none, the plan only reports
    its bytes per host) in a job of ``hosts`` hosts whose stages are placed by
    :func:`~ferret_core.planning.placement.stage_owners`."""

    hosts: int
    budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.hosts < 1:
            raise ConfigError(f"a job has >= 1 host, got {self.hosts}")
        if self.budget_bytes is not None and self.budget_bytes < 0:
            raise ConfigError(f"a host's memory budget must be >= 0 bytes, got {self.budget_bytes}")


def follower_bytes(model: MemoryModel, stage: int) -> int:
    """Bytes of rank 0's follower copy of a remote ``stage``: its slots of the stage's weights and their
    slot table (the current slot, a version and a reader count per slot: int64s)."""
    unit = model.settings.unit_bytes
    table = (1 + 2 * FOLLOWER_SLOTS) * SLOT_TABLE_ENTRY_BYTES
    return FOLLOWER_SLOTS * model.geometry.weights[stage] * unit + table


def host_bytes(
    model: MemoryModel, workers: Sequence[WorkerConfig], hosts: int, owners: Sequence[int] | None = None
) -> tuple[int, ...]:
    """The configuration's bytes on each of ``hosts`` hosts (rank 0 first), stage j on rank ``owners[j]``
    (default: :func:`~ferret_core.planning.placement.stage_owners`, the trainer's placement; module
    docstring). One host holds :meth:`MemoryModel.total` exactly."""
    stages, record = model.stage_breakdown(workers)
    owners = stage_owners(len(stages), hosts) if owners is None else tuple(owners)
    if len(owners) != len(stages) or not all(0 <= o < hosts for o in owners):
        raise ConfigError(f"owners must name a rank 0..{hosts - 1} for each of {len(stages)} stage(s), got {owners}")
    out = [0] * hosts
    out[0] += sum(record.values())
    for stage, (owner, part) in enumerate(zip(owners, stages, strict=True)):
        out[owner] += sum(part.values())
        if owner != 0:
            out[0] += follower_bytes(model, stage)
    return tuple(out)
