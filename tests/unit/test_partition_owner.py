"""PartitionOwner's rebalance callbacks under both protocols: eager (the whole assignment each time) and
cooperative (what an assignment adds or a revocation takes), with a fake consumer (no broker: no topic
metadata, so no outcome scan)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaException, TopicPartition

from services.config import KafkaSettings
from services.trainer.ledger import OffsetLedger
from services.trainer.partitions import PartitionOwner


@dataclass
class FakeConsumer:
    calls: list[tuple[str, list[int]]] = field(default_factory=list)

    def committed(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        return [TopicPartition(tp.topic, tp.partition, -1001) for tp in partitions]  # nothing committed

    def list_topics(self, topic: str, timeout: float = 0) -> object:
        raise KafkaException("no broker in a unit test")

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None: ...

    def _record(self, name: str, partitions: list[TopicPartition] | None = None) -> None:
        self.calls.append((name, sorted(tp.partition for tp in partitions or [])))

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._record("assign", partitions)

    def unassign(self) -> None:
        self._record("unassign")

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self._record("incremental_assign", partitions)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        self._record("incremental_unassign", partitions)


def owner(strategy: str | None = None) -> tuple[PartitionOwner, list[frozenset[int]]]:
    heard: list[frozenset[int]] = []
    properties = {} if strategy is None else {"partition.assignment.strategy": strategy}
    kafka = KafkaSettings(topic_prefix="t", properties=properties)
    return PartitionOwner(kafka, OffsetLedger(), flush=lambda _s: 0, on_assigned=heard.append), heard


def samples(*partitions: int) -> list[TopicPartition]:
    return [TopicPartition("t.samples", p) for p in partitions]


def test_cooperative_callbacks_add_and_take_only_what_moves() -> None:
    parts, heard = owner("cooperative-sticky")
    assert parts.cooperative
    consumer = FakeConsumer()
    parts.consumer = consumer  # type: ignore[assignment]
    parts.on_assign(consumer, samples(0, 1, 2))  # type: ignore[arg-type]
    parts.on_revoke(consumer, samples(2))  # type: ignore[arg-type]
    parts.on_assign(consumer, samples(4))  # type: ignore[arg-type]
    parts.on_lost(consumer, samples(0))  # type: ignore[arg-type]
    assert parts.assigned == frozenset({1, 4})
    assert consumer.calls == [
        ("incremental_assign", [0, 1, 2]),
        ("incremental_unassign", [2]),
        ("incremental_assign", [4]),
        ("incremental_unassign", [0]),
    ]
    assert heard == [frozenset({0, 1, 2}), frozenset({0, 1}), frozenset({0, 1, 4}), frozenset({1, 4})]


@pytest.mark.parametrize("strategy", [None, "range", "roundrobin", "range,roundrobin"])  # None: the default
def test_eager_callbacks_replace_the_whole_assignment(strategy: str | None) -> None:
    parts, heard = owner(strategy)
    assert not parts.cooperative
    consumer = FakeConsumer()
    parts.consumer = consumer  # type: ignore[assignment]
    parts.on_assign(consumer, samples(0, 1, 2))  # type: ignore[arg-type]
    parts.on_revoke(consumer, samples(0, 1, 2))  # type: ignore[arg-type]
    parts.on_assign(consumer, samples(1))  # type: ignore[arg-type]
    assert parts.assigned == frozenset({1})
    assert consumer.calls == [("assign", [0, 1, 2]), ("unassign", []), ("assign", [1])]
    assert heard == [frozenset({0, 1, 2}), frozenset(), frozenset({1})]  # readiness hears the empty gap
