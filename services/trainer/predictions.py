"""The ``ferret.v1.Prediction`` the record path publishes for one item: the one place where the learner's
:class:`~services.trainer.learner.ArrivalOutcome` (the core's ``SkipReason``, the top-k classes) meets
the proto's ``TrainingDecision`` and ``ClassProbability``. Every record carries :data:`HEADERS` (the
``content-type`` naming ``ferret.v1.Prediction``; docs/predictions.md)."""

from __future__ import annotations

from collections.abc import Mapping

from ferret_core.engine import SkipReason
from services.kafka import content_type
from services.kafka.record_codec import ValidSample
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.learner import ArrivalOutcome

# SkipReason → TrainingDecision. ``omitted`` (T3 omits every stage, which Alg. 2 never plans) has no value
# of its own in the published contract: UNSPECIFIED. ``non_finite`` is decided during training, after the
# prediction was published as dispatched: never a prediction's decision (counted in the status instead).
# The buffering methods' reasons (``evicted``,
# ``not_selected``, ``stream_end``) are decided after an item's prediction was published (its arrival is
# DISPATCHED into the method's window, docs/ocl.md), so no Prediction carries them: UNSPECIFIED too, which
# keeps the mapping total; the engine's counters count them, not per prediction (docs/service.md).
DECISIONS: Mapping[SkipReason | None, int] = {
    None: messages_pb2.TRAINING_DECISION_DISPATCHED,
    SkipReason.BUSY: messages_pb2.TRAINING_DECISION_SKIPPED_BUSY,
    SkipReason.WORKER_REMOVED: messages_pb2.TRAINING_DECISION_SKIPPED_WORKER_REMOVED,
    SkipReason.NO_LABEL: messages_pb2.TRAINING_DECISION_SKIPPED_NO_LABEL,
    SkipReason.OMITTED: messages_pb2.TRAINING_DECISION_UNSPECIFIED,
    SkipReason.NON_FINITE: messages_pb2.TRAINING_DECISION_UNSPECIFIED,
    SkipReason.EVICTED: messages_pb2.TRAINING_DECISION_UNSPECIFIED,
    SkipReason.NOT_SELECTED: messages_pb2.TRAINING_DECISION_UNSPECIFIED,
    SkipReason.STREAM_END: messages_pb2.TRAINING_DECISION_UNSPECIFIED,
}


# The headers of every prediction record.
HEADERS: list[tuple[str, bytes]] = [content_type.header(messages_pb2.Prediction)]


def decision(skipped: SkipReason | None) -> int:
    """The proto ``TrainingDecision`` of a training decision (every ``SkipReason`` has an entry)."""
    return DECISIONS[skipped]


def prediction_message(
    sample: ValidSample,
    outcome: ArrivalOutcome,
    *,
    item: int,
    online_accuracy: float,
    duplicate: bool,
    plan_version: int,
    instance_id: str,
    partition: int,
    offset: int,
    latency_ms: float,
    time_ms: int,
) -> messages_pb2.Prediction:
    has_label = sample.label is not None
    message = messages_pb2.Prediction(
        sample_id=sample.sample_id,
        sequence=sample.sequence,
        predicted_class=outcome.predicted_class,
        confidence=outcome.confidence,
        has_label=has_label,
        correct=has_label and outcome.predicted_class == sample.label,
        model_version=outcome.model_version,
        model_lineage=outcome.model_lineage,
        latency_ms=latency_ms,
        online_accuracy=online_accuracy,
        duplicate=duplicate,
        item=item,
        decision=decision(outcome.skipped),  # type: ignore[arg-type]
        worker=-1 if outcome.worker is None else outcome.worker,
        plan_version=plan_version,
        task=sample.task,
        stream=sample.stream,
        predicted_time_ms=time_ms,
        instance_id=instance_id,
        source_partition=partition,
        source_offset=offset,
        top_k=[messages_pb2.ClassProbability(class_index=c, probability=p) for c, p in outcome.top_k],
    )
    if sample.label is not None:
        message.label = sample.label
    return message
