"""Typed, frozen records of ``ferret.v1.Prediction`` as a downstream reader sees them (docs/predictions.md).

:meth:`PredictionRecord.from_kafka` decodes one Kafka record of ``<prefix>.predictions``: it checks the
``content-type`` header (:mod:`services.kafka.content_type`), parses the protobuf value and adds where the
record was read (topic, partition, offset, timestamp). Fields keep the proto's names and units, with
Python's types where the proto has sentinels: ``label`` and ``correct`` are None when the label was not
known at prediction time, ``worker`` is None when the item was not dispatched, ``decision`` is a name
(``dispatched``, ``busy``, ``worker_removed``, ``no_label``; the trainer's skip reasons, as in the metrics'
``reason`` label).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from ferret_core.errors import FerretError
from services.kafka import content_type
from services.proto_gen.ferret.v1 import messages_pb2

CONTENT_TYPE = content_type.content_type(messages_pb2.Prediction)
_DECISION_PREFIXES = ("TRAINING_DECISION_SKIPPED_", "TRAINING_DECISION_")


class PredictionReadError(FerretError, ValueError):
    """A record of the predictions topic that is not a ``ferret.v1.Prediction`` (or the topic cannot be
    read): the message names the topic, partition and offset, and the fix."""


class KafkaRecord(Protocol):
    """What :meth:`PredictionRecord.from_kafka` reads of a ``confluent_kafka.Message``."""

    def topic(self) -> str | None: ...

    def partition(self) -> int | None: ...

    def offset(self) -> int | None: ...

    def timestamp(self) -> tuple[int, int]: ...

    def value(self) -> bytes | None: ...

    def headers(self) -> list[tuple[str, str | bytes | None]] | dict[str, str | bytes | None] | None: ...


def decision_name(value: int) -> str:
    """``TRAINING_DECISION_SKIPPED_BUSY`` → ``busy``, ``…_DISPATCHED`` → ``dispatched``; a value this
    reader's stubs do not know yet (a newer trainer) → ``unknown_<n>``."""
    try:
        name = messages_pb2.TrainingDecision.Name(value)
    except ValueError:
        return f"unknown_{value}"
    for prefix in _DECISION_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :].lower()
    return name.lower()


@dataclass(frozen=True, slots=True)
class ClassProbability:
    """One of the most probable classes of a prediction and its softmax probability."""

    class_index: int
    probability: float


@dataclass(frozen=True, slots=True)
class PredictionRecord:
    """One published prediction (``ferret.v1.Prediction``) and where it was read from."""

    sample_id: str
    sequence: int  # the sample's position in its stream (the producer's numbering)
    item: int  # the trainer's counter i of valid arrivals
    predicted_class: int
    confidence: float  # softmax probability of predicted_class
    has_label: bool  # whether the label was known when predicting
    label: int | None  # the label, when known then and published (trainers before the field: None)
    correct: bool | None  # None when the label was not known
    top_k: tuple[ClassProbability, ...]  # most probable first; top_k[0] is predicted_class
    decision: str  # dispatched, busy, worker_removed, no_label (unspecified, unknown_<n>)
    worker: int | None  # the worker slot it was dispatched to; None when skipped
    model_version: int  # optimizer updates applied to the weights that predicted
    plan_version: int
    online_accuracy: float  # running online accuracy after this prediction, percent (as published)
    latency_ms: float  # sample event time → publication
    duplicate: bool  # re-emitted after a crash (at least once across crashes)
    task: int
    stream: str
    predicted_time_ms: int
    instance_id: str  # the trainer replica
    source_partition: int  # where the sample was read from
    source_offset: int
    topic: str  # where this prediction was read from
    partition: int
    offset: int
    timestamp_ms: int | None  # the Kafka record's timestamp (None when the broker gave none)
    model_lineage: int = 0  # the lineage model_version counts along (0: a trainer before the field)

    @classmethod
    def from_message(
        cls,
        message: messages_pb2.Prediction,
        *,
        topic: str = "",
        partition: int = -1,
        offset: int = -1,
        timestamp_ms: int | None = None,
    ) -> PredictionRecord:
        has_label = message.has_label
        return cls(
            sample_id=message.sample_id,
            sequence=message.sequence,
            item=message.item,
            predicted_class=message.predicted_class,
            confidence=message.confidence,
            has_label=has_label,
            label=message.label if message.HasField("label") else None,
            correct=message.correct if has_label else None,
            top_k=tuple(ClassProbability(p.class_index, p.probability) for p in message.top_k),
            decision=decision_name(int(message.decision)),
            worker=message.worker if message.worker >= 0 else None,
            model_version=message.model_version,
            model_lineage=message.model_lineage,
            plan_version=message.plan_version,
            online_accuracy=message.online_accuracy,
            latency_ms=message.latency_ms,
            duplicate=message.duplicate,
            task=message.task,
            stream=message.stream,
            predicted_time_ms=message.predicted_time_ms,
            instance_id=message.instance_id,
            source_partition=message.source_partition,
            source_offset=message.source_offset,
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
        )

    @classmethod
    def from_kafka(cls, record: KafkaRecord) -> PredictionRecord:
        """Decode a record of the predictions topic; :class:`PredictionReadError` when its
        ``content-type`` names another message or its value is not a ``Prediction``."""
        topic, partition, offset = record.topic() or "", record.partition(), record.offset()
        where = f"{topic} partition {partition} offset {offset}"
        declared = content_type.parse(record.headers())
        if declared is not None and not declared.names(messages_pb2.Prediction):
            raise PredictionReadError(
                f"{where}: content-type is {str(declared)!r}, expected {CONTENT_TYPE!r}; is this "
                "<prefix>.predictions? (check the topic prefix)"
            )
        message = messages_pb2.Prediction()
        try:
            message.ParseFromString(record.value() or b"")
        except DecodeError as exc:
            raise PredictionReadError(
                f"{where}: the value is not a ferret.v1.Prediction ({exc}); is this <prefix>.predictions?"
            ) from None
        kind, stamp = record.timestamp()
        return cls.from_message(
            message,
            topic=topic,
            partition=-1 if partition is None else partition,
            offset=-1 if offset is None else offset,
            timestamp_ms=stamp if kind != 0 else None,  # 0: TIMESTAMP_NOT_AVAILABLE
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values (``top_k`` as ``[{"class_index", "probability"}, …]``), for JSON and DataFrames."""
        return dataclasses.asdict(self)
