"""What the orchestrator records during a run, for the live view and the report.

Filled as the run goes (a failed run keeps what it got): the plans before and after the budget change,
the change itself as the gRPC reply reported it, the snapshots, and a status timeline sampled from
``GetStatus``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from services.proto_gen.ferret.v1 import control_pb2 as pb


@dataclass(frozen=True)
class StatusPoint:
    """One ``GetStatus`` reply, reduced to what the view and the memory plot need."""

    time_ms: int
    state: str
    items_received: int
    items_valid: int
    predictions_published: int
    dead_lettered: int
    dispatched: int
    backward_passes: int
    skipped: dict[str, int]
    online_accuracy: float
    budget_bytes: int | None
    planned_bytes: int
    measured_bytes: int
    lag_items: int
    lag_seconds: float
    items_per_second: float
    latency_ms_p50: float
    latency_ms_p99: float
    plan_version: int
    replans: int
    pauses: int
    last_snapshot_version: int

    @classmethod
    def from_reply(cls, reply: pb.StatusReply) -> StatusPoint:
        return cls(
            time_ms=reply.time_ms,
            state=pb.ServiceState.Name(reply.state).removeprefix("SERVICE_STATE_").lower(),
            items_received=reply.items_received,
            items_valid=reply.items_valid,
            predictions_published=reply.predictions_published,
            dead_lettered=reply.items_dead_lettered,
            dispatched=reply.items_dispatched,
            backward_passes=reply.backward_passes,
            skipped=dict(sorted(reply.items_skipped.items())),
            online_accuracy=reply.online_accuracy,
            budget_bytes=reply.budget_bytes if reply.HasField("budget_bytes") else None,
            planned_bytes=reply.predicted_bytes,
            measured_bytes=reply.measured_bytes,
            lag_items=reply.lag_items,
            lag_seconds=reply.lag_seconds,
            items_per_second=reply.items_per_second,
            latency_ms_p50=reply.latency_ms_p50,
            latency_ms_p99=reply.latency_ms_p99,
            plan_version=reply.plan_version,
            replans=reply.replans,
            pauses=reply.pauses,
            last_snapshot_version=reply.last_snapshot_version,
        )

    @property
    def outcomes(self) -> int:
        """Items the trainer finished with: a prediction published or a dead letter."""
        return self.predictions_published + self.dead_lettered


@dataclass(frozen=True)
class PlanView:
    """A plan as the control plane replied it: the ``ferret plan --json`` document plus its version."""

    plan: dict[str, Any]  # Plan.to_dict(), i.e. the `ferret plan --json` schema
    version: int
    budget_bytes: int | None
    planned_bytes: int
    min_feasible_bytes: int

    @classmethod
    def from_reply(cls, reply: pb.PlanReply) -> PlanView:
        return cls(
            plan=json.loads(reply.plan_json),
            version=reply.plan_version,
            budget_bytes=reply.budget_bytes if reply.HasField("budget_bytes") else None,
            planned_bytes=reply.predicted_bytes,
            min_feasible_bytes=reply.min_feasible_bytes,
        )

    def brief(self) -> str:
        """``2 stages × 2 workers (1 live)``."""
        p = self.plan
        return f"{p['num_stages']} stages × {p['num_workers']} workers ({p['live_workers']} live)"


@dataclass(frozen=True)
class BudgetChange:
    """One SetMemoryBudget call: when, from what to what, and what the reply said."""

    requested_time_ms: int  # when the call was made (ms since the epoch)
    applied_time_ms: int  # when the trainer applied the plan (from the reply)
    from_bytes: int | None  # None: unconstrained
    to_bytes: int
    planning_seconds: float
    stall_seconds: float
    call_seconds: float  # the client's round trip
    predictions_before: int  # predictions published when the call was made
    plan_version_before: int
    plan_version_after: int
    planned_bytes_before: int
    planned_bytes_after: int
    plan_changed: bool

    def to_dict(self, origin_ms: int | None = None) -> dict[str, Any]:
        """The summary's entry; ``time_s`` is seconds after ``origin_ms`` (the first prediction)."""
        out: dict[str, Any] = {
            "time_ms": self.applied_time_ms or self.requested_time_ms,
            "time_s": None,
            "from": self.from_bytes,
            "to": self.to_bytes,
            **{k: v for k, v in asdict(self).items() if k not in ("from_bytes", "to_bytes")},
        }
        if origin_ms is not None:
            out["time_s"] = round((out["time_ms"] - origin_ms) / 1000, 3)
        return out


@dataclass(frozen=True)
class BudgetRefusal:
    """The demo's SetMemoryBudget call that the trainer refused (no smaller plan exists): the gRPC status,
    the minimum feasible bytes the reply carried, and the plan version before and after (unchanged)."""

    requested_time_ms: int
    to_bytes: int
    code: str  # the gRPC status name, e.g. FAILED_PRECONDITION
    details: str  # the server's one-line reason
    min_feasible_bytes: int | None  # from the reply's rich error details
    call_seconds: float
    predictions_before: int
    plan_version_before: int
    plan_version_after: int  # from GetPlan after the refusal
    plan_changed: bool  # the plan GetPlan reports after it differs from the one before (expected False)

    def to_dict(self, origin_ms: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"time_ms": self.requested_time_ms, "time_s": None, "to": self.to_bytes, **asdict(self)}
        del out["to_bytes"]
        if origin_ms is not None:
            out["time_s"] = round((self.requested_time_ms - origin_ms) / 1000, 3)
        return out


@dataclass
class RunRecord:
    """Everything a run observed, in the order it happened. Mutable: the orchestrator fills it."""

    dataset: str
    model: str
    profile: str | None
    items_requested: int
    rate: float
    topic_prefix: str
    out_dir: Path
    started_time_ms: int
    bootstrap_servers: str = ""
    redis_url: str = ""
    stack: str = ""  # "embedded" / "external" per part
    control_target: str = ""
    metrics_port: int = 0
    trainer_ready_s: float | None = None
    items_produced: int | None = None  # delivered, from the producer's report
    producer_exit_code: int | None = None
    trainer_exit_code: int | None = None
    plan_before: PlanView | None = None
    plan_after: PlanView | None = None
    budget_changes: list[BudgetChange] = field(default_factory=list)
    budget_step: str | None = None  # what the budget step asks for and why (options.budget_step)
    budget_refusal: BudgetRefusal | None = None  # the step's call, refused as expected
    snapshot_requested: dict[str, Any] | None = None
    snapshots_stored: list[dict[str, Any]] = field(default_factory=list)
    timeline: list[StatusPoint] = field(default_factory=list)
    measured_bytes_before_change: int | None = None
    ended_time_ms: int | None = None
    complete: bool = False  # every produced item got its outcome before the deadline
    error: str | None = None

    @property
    def budget_step_done(self) -> bool:
        """The budget step's call has returned: a change applied, or the expected refusal."""
        return bool(self.budget_changes) or self.budget_refusal is not None

    @property
    def last_status(self) -> StatusPoint | None:
        return self.timeline[-1] if self.timeline else None
