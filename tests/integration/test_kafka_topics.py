"""Topic set-up and counting against a real broker: the embedded Tansu, and Apache Kafka when Docker
answers. Counts come from consuming, never from watermarks (DESIGN §4 "Counting")."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, Message, Producer

from services.kafka import KafkaSetupError, TopicNames, count_distinct, ensure_topics
from services.proto_gen.ferret.v1 import messages_pb2

pytestmark = pytest.mark.integration

IMAGE_BYTES = 784  # one 28x28 uint8 image


def _sample(i: int) -> bytes:
    sample = messages_pb2.Sample(
        id=f"mnist/{i}",
        sequence=i,
        event_time_ms=time.time_ns() // 1_000_000,
        label=i % 10,
        stream="mnist",
        tensor=messages_pb2.Tensor(shape=[1, 28, 28], dtype="uint8", data=bytes([i % 256]) * IMAGE_BYTES),
    )
    return sample.SerializeToString()


def _produce(bootstrap: str, topic: str, items: range) -> None:
    errors: list[str] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            errors.append(f"{msg.key()!r}: {err}")

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for i in items:
        producer.produce(topic, key=f"mnist/{i}".encode(), value=_sample(i), on_delivery=on_delivery)
    assert producer.flush(15) == 0, "messages still in flight after 15 s"
    assert errors == []


def test_topics_are_created_idempotently(any_kafka: str, topic_prefix: str) -> None:
    names = TopicNames(topic_prefix)
    first = ensure_topics(any_kafka, topic_prefix, sample_partitions=3)
    assert first == {names.samples: 3, names.labels: 3, names.predictions: 3, names.dlq: 3, names.events: 1}
    assert ensure_topics(any_kafka, topic_prefix, sample_partitions=3) == first


def test_thousand_messages_are_counted_back_exactly(any_kafka: str, topic_prefix: str) -> None:
    names = TopicNames(topic_prefix)
    ensure_topics(any_kafka, topic_prefix, sample_partitions=3)
    _produce(any_kafka, names.samples, range(1000))

    count = count_distinct(any_kafka, names.samples, idle_timeout=1.0, max_seconds=60)
    assert (count.records, count.distinct, count.duplicates) == (1000, 1000, 0)
    assert not count.timed_out
    assert sorted(count.per_partition) == [0, 1, 2] and sum(count.per_partition.values()) == 1000

    _produce(any_kafka, names.samples, range(975, 1000))  # re-sent: what a crash-and-replay produces
    by_id = count_distinct(
        any_kafka,
        names.samples,
        id_of=lambda m: messages_pb2.Sample.FromString(m.value() or b"").id,
        idle_timeout=1.0,
    )
    assert (by_id.records, by_id.distinct, by_id.duplicates, by_id.undecodable) == (1025, 1000, 25, 0)


def test_an_empty_topic_counts_zero_and_a_missing_one_fails(bootstrap_servers: str, topic_prefix: str) -> None:
    ensure_topics(bootstrap_servers, topic_prefix)
    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).predictions, idle_timeout=0.3)
    assert (count.records, count.distinct) == (0, 0)
    with pytest.raises(KafkaSetupError, match="not readable"):
        count_distinct(bootstrap_servers, f"{topic_prefix}.missing", idle_timeout=0.3)


def test_invalid_prefix_and_partition_counts_are_refused(bootstrap_servers: str) -> None:
    with pytest.raises(ValueError, match="invalid topic prefix"):
        ensure_topics(bootstrap_servers, "bad prefix")
    with pytest.raises(ValueError, match="partition counts"):
        ensure_topics(bootstrap_servers, "ok", sample_partitions=0)
