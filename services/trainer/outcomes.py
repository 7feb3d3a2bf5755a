"""Where a sample partition's outcomes are, so a restarted (or newly assigned) trainer flags every
re-emitted outcome: exactly once without faults, at least once with every re-emission flagged across
crashes and rebalances.

The outcome topics (``<prefix>.predictions`` and ``<prefix>.samples.dlq``) are written *partition-aligned*:
the outcome of sample partition p goes to partition p mod n of each (the same partition the producers'
murmur2 key partitioner picks when both topics have as many partitions, as :func:`ensure_topics` makes
them). Within one outcome partition the outcomes of p are therefore in p's offset order. With every commit
of p's resume offset r the trainer also commits, for each outcome topic, the outcome offset q before which
every outcome of p's offsets below r lies (:class:`OutcomePositions`): outcomes of offsets ≥ r that a crash
left published can only be at q or later. On assignment :func:`scan_outcomes` reads each outcome partition
from its committed q to its end (``enable.partition.eof``; a few hundred records: one commit interval) and
returns the source offsets that already have an outcome: re-processing them publishes ``duplicate=true``
(predictions) or ``ferret.dlq.duplicate: true`` (dead letters). The committed offsets themselves are the
group's: Kafka keeps an offset per (group, topic, partition), also of topics the group does not consume.

A topic with fewer partitions than the samples cannot be aligned (two sample partitions would share one
outcome partition, and one committed q): it is written with p mod n and not scanned; its duplicates are
flagged only below the committed offset (logged once at assignment).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

from services.kafka.record_codec import DLQ_OFFSET, DLQ_PARTITION, DLQ_TOPIC
from services.proto_gen.ferret.v1 import messages_pb2

log = logging.getLogger("ferret.trainer")

SCAN_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class OutcomeTopics:
    """The outcome topics and their partition counts, against ``samples`` partitions."""

    samples: str
    predictions: str
    dlq: str
    partitions: Mapping[str, int]  # topic -> partition count (from the broker's metadata)
    sample_partitions: int

    def partition_for(self, topic: str, source_partition: int) -> int:
        return source_partition % max(1, self.partitions.get(topic, 1))

    def aligned(self, topic: str) -> bool:
        """Whether every sample partition has an outcome partition of its own in ``topic``."""
        return self.partitions.get(topic, 0) >= self.sample_partitions

    @property
    def names(self) -> tuple[str, str]:
        return (self.predictions, self.dlq)


class OutcomePositions:
    """Per (outcome topic, sample partition), the (source offset, outcome offset) of delivered outcomes in
    delivery order, and the outcome offset to commit with a resume offset (module docstring). Used on the
    loop thread only (deliveries are served there)."""

    def __init__(self) -> None:
        self._delivered: dict[tuple[str, int], deque[tuple[int, int]]] = {}
        self._start: dict[tuple[str, int], int] = {}  # committed (or to commit) q

    def delivered(self, topic: str, source_partition: int, source_offset: int, outcome_offset: int) -> None:
        if outcome_offset >= 0:
            self._delivered.setdefault((topic, source_partition), deque()).append((source_offset, outcome_offset))

    def known(self, topic: str, source_partition: int, start: int) -> None:
        """The committed q read at assignment (what the previous owner committed)."""
        self._start[(topic, source_partition)] = start

    def start_for(self, topic: str, source_partition: int, resume_offset: int) -> int | None:
        """q for committing ``resume_offset`` r: one past the outcome of the highest source offset below r
        (None when nothing is known yet). Forgets what lies below r."""
        key = (topic, source_partition)
        delivered = self._delivered.get(key)
        while delivered and delivered[0][0] < resume_offset:
            self._start[key] = delivered.popleft()[1] + 1
        return self._start.get(key)

    def forget(self, partitions: Iterable[int]) -> None:
        gone = set(partitions)
        for key in [k for k in (*self._delivered, *self._start) if k[1] in gone]:
            self._delivered.pop(key, None)
            self._start.pop(key, None)


def scan_outcomes(
    client_config: Mapping[str, object],
    topics: OutcomeTopics,
    starts: Mapping[tuple[str, int], int],
    *,
    timeout_s: float = SCAN_TIMEOUT_S,
) -> dict[int, set[int]]:
    """Sample offsets that already have an outcome, per sample partition: every outcome at or after
    ``starts[(topic, sample partition)]`` (q, or ``OFFSET_BEGINNING`` where none was committed) in the
    aligned outcome partitions, read to their end."""
    found: dict[int, set[int]] = {}
    assignment = [
        TopicPartition(topic, topics.partition_for(topic, source), start)
        for (topic, source), start in starts.items()
        if (start >= 0 or start == OFFSET_BEGINNING) and topics.aligned(topic)
    ]
    if not assignment:
        return found
    consumer = Consumer(
        {
            **client_config,
            "group.id": f"ferret-outcome-scan-{uuid.uuid4().hex[:8]}",  # never joins nor commits
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 10,
        }
    )
    started = time.monotonic()
    pending = {(tp.topic, tp.partition) for tp in assignment}
    read = 0
    try:
        consumer.assign(assignment)
        while pending and time.monotonic() - started < timeout_s:
            for message in consumer.consume(num_messages=500, timeout=0.1):
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard((message.topic(), message.partition()))
                    else:
                        log.warning("outcome scan: %s", error.str())
                    continue
                read += 1
                source = _source_of(message, topics)
                if source is not None:
                    found.setdefault(source[0], set()).add(source[1])
    finally:
        consumer.close()
    if pending:
        log.warning("outcome scan: %s not read to the end within %.0f s; some re-emitted outcomes may go "
                    "unflagged", sorted(pending), timeout_s)  # fmt: skip
    log.info("outcome scan: %d outcomes read in %.2f s; already published: %s", read, time.monotonic() - started,
             {p: len(o) for p, o in found.items()})  # fmt: skip
    return found


def _source_of(message: object, topics: OutcomeTopics) -> tuple[int, int] | None:
    """(sample partition, offset) an outcome record names, or None (another topic's, or unreadable)."""
    topic = message.topic()  # type: ignore[attr-defined]
    value = message.value()  # type: ignore[attr-defined]
    if topic == topics.predictions:
        prediction = messages_pb2.Prediction()
        try:
            prediction.ParseFromString(value or b"")
        except Exception:  # protobuf's DecodeError: not ours
            return None
        return int(prediction.source_partition), int(prediction.source_offset)
    headers = {k: (v or b"").decode("utf-8", "replace") for k, v in (message.headers() or [])}  # type: ignore[attr-defined]
    if headers.get(DLQ_TOPIC) != topics.samples:
        return None
    try:
        return int(headers[DLQ_PARTITION]), int(headers[DLQ_OFFSET])
    except (KeyError, ValueError):
        return None
