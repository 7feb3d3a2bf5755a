"""What the control plane needs from the trainer: the :class:`TrainerPort` protocol and its data.

The trainer (written separately) implements these six methods; the control plane never reaches into
it otherwise. Every method is called from a gRPC or re-planner thread, never from the trainer's own
loop, so the trainer guards its state itself. Contract per method:

- ``current_plan()`` → ``(plan, plan_version)``: the plan in force and its version (≥ 1 once running).
- ``apply_plan(plan, version)``: drain or migrate in-flight work, swap the plan live, and return
  :class:`AppliedPlan` (the version now in force, normally ``version``, and how long the stream was
  paused). Called only from the re-planner's single worker thread, so two plans are never applied at
  once. It must leave the old plan in force when it raises.
- ``status()`` → :class:`TrainerStatus`: cheap (WatchStatus calls it every interval per watcher).
- ``save_snapshot(metadata)`` / ``restore_snapshot(version)`` / ``list_snapshots(verify)`` →
  :class:`SnapshotInfo`. ``restore_snapshot(None)`` restores the newest valid snapshot; a missing one
  raises :class:`services.control.errors.SnapshotNotFound` (or the store's ``SnapshotNotFoundError``).
- ``deadline`` (``apply_plan``, ``save_snapshot``, ``restore_snapshot``): the caller's
  :class:`~services.control.deadline.CallDeadline`, or None. Check it right before acting, after any
  wait for the trainer's own thread, and raise its ``DeadlineExpired`` with nothing changed once it has
  passed (the client was already answered DEADLINE_EXCEEDED).

Errors: raise ``FerretError`` subclasses with a one-line reason; the servicer maps them to status codes
(``services/control/errors.py``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from ferret_core.plan import Plan
from services.control.deadline import CallDeadline

if TYPE_CHECKING:
    from ferret_core.engine.processes.hosts import Freshness


class TrainerState(enum.Enum):
    """Where the trainer is in its life cycle (proto ``ServiceState``)."""

    STARTING = "starting"
    RUNNING = "running"
    REPLANNING = "replanning"
    SNAPSHOTTING = "snapshotting"
    RESTORING = "restoring"
    STOPPING = "stopping"


@dataclass(frozen=True)
class AppliedPlan:
    """What ``apply_plan`` reports: the version now in force and the pause it caused."""

    version: int
    stall_seconds: float
    applied_time_ms: int


@dataclass(frozen=True)
class TrainerStatus:
    """A point-in-time view of the trainer's counters (proto ``StatusReply``); every field has a default
    so a trainer fills what it tracks. Counters count since the start (or the restored snapshot). Names
    are the counters' own, also in metrics and snapshots; where the published proto says otherwise
    (``items_skipped``, ``planned_bytes``), :func:`services.control.messages.status_reply` translates."""

    state: TrainerState = TrainerState.RUNNING
    instance_id: str = ""
    items_received: int = 0
    items_valid: int = 0
    items_dispatched: int = 0
    predictions_published: int = 0
    duplicates_published: int = 0
    backward_passes: int = 0  # items trained (backward passes run)
    labels_joined: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)  # by SkipReason: "busy", "worker_removed", …
    dead_lettered: Mapping[str, int] = field(default_factory=dict)  # by the codec's rejection reason
    labelled_predictions: int = 0
    correct_predictions: int = 0
    online_accuracy: float = 0.0
    budget_bytes: int | None = None  # None: unconstrained
    planned_bytes: int = 0
    measured_bytes: int = 0
    lag_items: int = 0  # sample records behind the brokers' ends, summed over partitions whose lag is known
    lag_seconds: float = 0.0  # age (event time) of the newest consumed item where behind; 0 when caught up
    lag_items_by_partition: Mapping[int, int] = field(default_factory=dict)  # -1: unknown (services/trainer/lag.py)
    items_per_second: float = 0.0
    latency_ms_p50: float = 0.0
    latency_ms_p99: float = 0.0
    model_version: int = 0
    plan_version: int = 0
    replans: int = 0
    pauses: int = 0
    last_snapshot_version: int = 0
    compensations_truncated: int = 0  # compensations cut short: the gradient was staler than the deltas kept
    rollbacks: int = 0  # the live model rolled back to the last-good one (services/trainer/guard)
    promotions: int = 0  # the live model's weights made last-good
    drifts: int = 0  # drifts detected on the prediction outcomes
    last_good_version: int = 0  # the model version of the last-good weights (0: not guarded)
    model_lineage: int = 0  # the lineage model_version counts along (services.trainer.lineage)
    counters: Mapping[str, int] = field(default_factory=dict)
    # several hosts: how far behind the newest master the predicting copies were (GetStatus counters
    # freshness_*; metrics ferret_prediction_freshness_*); None on one host, where predictions read the master
    freshness: Freshness | None = None
    # several hosts: the plan's planned bytes per host, rank 0 first (GetStatus counters planned_host_bytes.<rank>;
    # metrics ferret_planned_host_bytes{rank}); empty on one host
    planned_host_bytes: tuple[int, ...] = ()

    @property
    def items_dead_lettered(self) -> int:
        return sum(self.dead_lettered.values())


@dataclass(frozen=True)
class PartitionOffset:
    """Per partition, the smallest offset whose work the weights do not yet reflect."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot's manifest as listed, written or restored (proto ``SnapshotInfo``)."""

    version: int
    instance_id: str = ""
    created_time_ms: int = 0
    chunks: int = 0
    total_bytes: int = 0
    sha256: str = ""
    offsets: tuple[PartitionOffset, ...] = ()
    plan_version: int = 0
    valid: bool = True
    error: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    seconds: float = 0.0  # time to write, pause included (save); 0 when listed


@runtime_checkable
class TrainerPort(Protocol):
    """The trainer as the control plane sees it (see the module docstring for the contract)."""

    def current_plan(self) -> tuple[Plan, int]: ...

    def apply_plan(self, plan: Plan, version: int, deadline: CallDeadline | None = None) -> AppliedPlan: ...

    def status(self) -> TrainerStatus: ...

    def save_snapshot(self, metadata: Mapping[str, str], deadline: CallDeadline | None = None) -> SnapshotInfo: ...

    def restore_snapshot(self, version: int | None, deadline: CallDeadline | None = None) -> SnapshotInfo: ...

    def list_snapshots(self, verify: bool) -> list[SnapshotInfo]: ...
