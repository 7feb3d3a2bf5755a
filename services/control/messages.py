"""Conversions between the control plane's data (``Plan``, ``TrainerStatus``, ``SnapshotInfo``) and
the ``ferret.v1`` messages. Pure functions; the servicer builds replies with them, the client reads."""

from __future__ import annotations

import json

from ferret_core.plan import Plan
from services.control.trainer_port import PartitionOffset, SnapshotInfo, TrainerState, TrainerStatus
from services.proto_gen.ferret.v1 import control_pb2 as pb

STATE_TO_PB: dict[TrainerState, int] = {
    TrainerState.STARTING: pb.SERVICE_STATE_STARTING,
    TrainerState.RUNNING: pb.SERVICE_STATE_RUNNING,
    TrainerState.REPLANNING: pb.SERVICE_STATE_REPLANNING,
    TrainerState.SNAPSHOTTING: pb.SERVICE_STATE_SNAPSHOTTING,
    TrainerState.RESTORING: pb.SERVICE_STATE_RESTORING,
    TrainerState.STOPPING: pb.SERVICE_STATE_STOPPING,
}


def plan_reply(
    plan: Plan,
    version: int,
    *,
    applied_time_ms: int = 0,
    planning_seconds: float = 0.0,
    stall_seconds: float = 0.0,
) -> pb.PlanReply:
    """The typed fields of ``plan`` plus ``plan_json`` (``Plan.to_dict()`` verbatim)."""
    reply = pb.PlanReply(
        model=plan.model,
        stages=[pb.Stage(units=list(stage)) for stage in plan.stages],
        partition=list(plan.partition.boundaries),
        num_stages=plan.num_stages,
        workers=[
            pb.Worker(
                index=w.index,
                delay=w.delay,
                live=w.live,
                recompute=w.recompute,
                accumulation=list(w.accumulation),
                omission=list(w.omission),
            )
            for w in plan.workers
        ],
        num_workers=plan.num_workers,
        live_workers=plan.live_workers,
        predicted_bytes=plan.planned_bytes,
        paper_memory_elements=plan.paper_memory_elements,
        min_feasible_bytes=plan.min_feasible_bytes,
        adaptation_rate=plan.adaptation_rate,
        arrival_interval_s=plan.arrival_interval,
        stage_forward_time_s=plan.stage_forward_time,
        stage_backward_time_s=plan.stage_backward_time,
        decay=plan.decay,
        memory_model=plan.memory_model,
        dtype=plan.dtype,
        memory_breakdown=dict(plan.memory_breakdown),
        plan_json=json.dumps(plan.to_dict(), separators=(",", ":")),
        plan_version=version,
        applied_time_ms=applied_time_ms,
        planning_seconds=planning_seconds,
        stall_seconds=stall_seconds,
        host_bytes=list(plan.host_bytes),
    )
    if plan.budget_bytes is not None:
        reply.budget_bytes = plan.budget_bytes
    return reply


def plan_from_reply(reply: pb.PlanReply) -> Plan:
    """The ``Plan`` a reply carries (read from ``plan_json``)."""
    return Plan.from_dict(json.loads(reply.plan_json))


def status_reply(status: TrainerStatus, *, state: TrainerState, time_ms: int, uptime_s: float) -> pb.StatusReply:
    """``state`` overrides the trainer's (the control plane knows about re-plans and shutdown);
    dead letters by reason go to ``counters`` as ``dead_lettered.<reason>``, and so does
    ``compensations_truncated``. The one translation of the status's names to the published proto's:
    ``skipped`` → ``items_skipped``, ``planned_bytes`` → ``predicted_bytes`` (ferret.v1 keeps its published
    field name), the sum of ``dead_lettered`` → ``items_dead_lettered``."""
    counters = dict(status.counters)
    counters.update({f"dead_lettered.{reason}": n for reason, n in status.dead_lettered.items()})
    counters["compensations_truncated"] = status.compensations_truncated
    counters.update({f"lag_items.{partition}": n for partition, n in status.lag_items_by_partition.items()})
    reply = pb.StatusReply(
        instance_id=status.instance_id,
        state=STATE_TO_PB[state],  # type: ignore[arg-type]
        time_ms=time_ms,
        uptime_s=uptime_s,
        items_received=status.items_received,
        items_valid=status.items_valid,
        items_dead_lettered=status.items_dead_lettered,
        predictions_published=status.predictions_published,
        duplicates_published=status.duplicates_published,
        items_dispatched=status.items_dispatched,
        items_skipped={str(reason): n for reason, n in status.skipped.items()},
        backward_passes=status.backward_passes,
        labels_joined=status.labels_joined,
        online_accuracy=status.online_accuracy,
        labelled_predictions=status.labelled_predictions,
        correct_predictions=status.correct_predictions,
        predicted_bytes=status.planned_bytes,
        measured_bytes=status.measured_bytes,
        lag_items=status.lag_items,
        lag_seconds=status.lag_seconds,
        items_per_second=status.items_per_second,
        latency_ms_p50=status.latency_ms_p50,
        latency_ms_p99=status.latency_ms_p99,
        model_version=status.model_version,
        plan_version=status.plan_version,
        replans=status.replans,
        pauses=status.pauses,
        last_snapshot_version=status.last_snapshot_version,
        counters=counters,
        rollbacks=status.rollbacks,
        promotions=status.promotions,
        drifts=status.drifts,
        last_good_version=status.last_good_version,
        model_lineage=status.model_lineage,
    )
    if status.budget_bytes is not None:
        reply.budget_bytes = status.budget_bytes
    return reply


def snapshot_message(info: SnapshotInfo) -> pb.SnapshotInfo:
    return pb.SnapshotInfo(
        version=info.version,
        instance_id=info.instance_id,
        created_time_ms=info.created_time_ms,
        chunks=info.chunks,
        total_bytes=info.total_bytes,
        sha256=info.sha256,
        offsets=[pb.TopicPartitionOffset(topic=o.topic, partition=o.partition, offset=o.offset) for o in info.offsets],
        plan_version=info.plan_version,
        valid=info.valid,
        error=info.error,
        metadata=dict(info.metadata),
        seconds=info.seconds,
    )


def snapshot_from_message(message: pb.SnapshotInfo) -> SnapshotInfo:
    return SnapshotInfo(
        version=message.version,
        instance_id=message.instance_id,
        created_time_ms=message.created_time_ms,
        chunks=message.chunks,
        total_bytes=message.total_bytes,
        sha256=message.sha256,
        offsets=tuple(PartitionOffset(o.topic, o.partition, o.offset) for o in message.offsets),
        plan_version=message.plan_version,
        valid=message.valid,
        error=message.error,
        metadata=dict(message.metadata),
        seconds=message.seconds,
    )
