"""Reading the run's outcome back from Kafka with an independent consumer (DESIGN §4 "Counting", §6).

Every count goes through :func:`services.kafka.admin.count_distinct`: a fresh group, every partition
assigned from the beginning, never watermarks. For the predictions topic the decoded records are kept
too, so the report's accuracy curve, latencies and throughput come from what was really published.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import Message

from services.kafka.admin import TopicCount, TopicNames, count_distinct, message_key
from services.proto_gen.ferret.v1 import messages_pb2

DECISION_NAMES: dict[int, str] = {
    messages_pb2.TRAINING_DECISION_DISPATCHED: "dispatched",
    messages_pb2.TRAINING_DECISION_SKIPPED_BUSY: "busy",
    messages_pb2.TRAINING_DECISION_SKIPPED_WORKER_REMOVED: "worker_removed",
    messages_pb2.TRAINING_DECISION_SKIPPED_NO_LABEL: "no_label",
}


@dataclass(frozen=True)
class PredictionRecord:
    """The fields of one ``ferret.v1.Prediction`` that the report uses."""

    sample_id: str
    item: int
    has_label: bool
    correct: bool
    online_accuracy: float
    latency_ms: float
    duplicate: bool
    decision: str
    plan_version: int
    model_version: int
    predicted_time_ms: int

    @classmethod
    def from_message(cls, message: messages_pb2.Prediction) -> PredictionRecord:
        return cls(
            sample_id=message.sample_id,
            item=message.item,
            has_label=message.has_label,
            correct=message.correct,
            online_accuracy=message.online_accuracy,
            latency_ms=message.latency_ms,
            duplicate=message.duplicate,
            decision=DECISION_NAMES.get(int(message.decision), "unspecified"),
            plan_version=message.plan_version,
            model_version=message.model_version,
            predicted_time_ms=message.predicted_time_ms,
        )


def distinct_in_time_order(records: Iterable[PredictionRecord]) -> list[PredictionRecord]:
    """One record per sample id (a non-duplicate one when there is one), ordered by prediction time."""
    chosen: dict[str, PredictionRecord] = {}
    for record in records:
        kept = chosen.get(record.sample_id)
        if kept is None or (kept.duplicate and not record.duplicate):
            chosen[record.sample_id] = record
    return sorted(chosen.values(), key=lambda r: (r.predicted_time_ms, r.item))


@dataclass(frozen=True)
class Outcome:
    """What the independent consumer read: the prediction records and the three topics' counts."""

    predictions: list[PredictionRecord]  # every record read, in consumption order (duplicates included)
    predictions_count: TopicCount
    samples_count: TopicCount
    dlq_count: TopicCount


def read_outcome(
    bootstrap_servers: str, prefix: str, *, idle_timeout: float = 2.0, max_seconds: float = 300.0
) -> Outcome:
    """Count ``<prefix>.samples``, ``.predictions`` and ``.samples.dlq`` from the beginning, concurrently,
    keeping the decoded predictions."""
    topics = TopicNames(prefix)
    records: list[PredictionRecord] = []

    def prediction_id(message: Message) -> Hashable | None:
        decoded = messages_pb2.Prediction.FromString(message.value() or b"")
        records.append(PredictionRecord.from_message(decoded))  # one consumer thread appends
        return decoded.sample_id or None

    def count(topic: str, id_of: Callable[[Message], Hashable | None] = message_key) -> TopicCount:
        return count_distinct(bootstrap_servers, topic, id_of=id_of, idle_timeout=idle_timeout, max_seconds=max_seconds)

    with ThreadPoolExecutor(max_workers=3, thread_name_prefix="ferret-demo-count") as pool:
        predictions = pool.submit(count, topics.predictions, id_of=prediction_id)
        samples = pool.submit(count, topics.samples)
        dlq = pool.submit(count, topics.dlq)
        return Outcome(records, predictions.result(), samples.result(), dlq.result())
