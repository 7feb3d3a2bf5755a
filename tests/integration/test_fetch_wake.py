"""Waking the fetcher after a resume against the real broker: the leader answers the wake-up
request, and every record produced around the pause is consumed once, in order, after the resume."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from services.kafka import ensure_topics
from services.kafka.fetch_wake import resume_and_wake
from services.trainer.stream import CONSUMER_DEFAULTS

pytestmark = pytest.mark.integration


def test_records_around_a_pause_are_all_consumed_after_resume_and_wake(
    bootstrap_servers: str, topic_prefix: str
) -> None:
    ensure_topics(bootstrap_servers, topic_prefix)
    topic = f"{topic_prefix}.samples"
    producer = Producer({"bootstrap.servers": bootstrap_servers, "linger.ms": 0})
    consumer = Consumer(
        {"bootstrap.servers": bootstrap_servers, "group.id": f"{topic_prefix}-wake", **CONSUMER_DEFAULTS}
    )
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        got: list[bytes] = []

        def read_until(n: int) -> None:
            deadline = time.monotonic() + 30
            while len(got) < n and time.monotonic() < deadline:
                got.extend(m.value() for m in consumer.consume(64, 0.1) if m.error() is None)

        for i in range(3):
            producer.produce(topic, value=b"%d" % i)
        producer.flush(10)
        read_until(3)
        partitions = consumer.assignment()
        consumer.pause(partitions)
        for i in range(3, 6):  # produced while paused
            producer.produce(topic, value=b"%d" % i)
        producer.flush(10)
        assert resume_and_wake(consumer, partitions)  # the leader answered the wake-up request
        for i in range(6, 9):  # and after the resume
            producer.produce(topic, value=b"%d" % i)
        producer.flush(10)
        read_until(9)
        assert got == [b"%d" % i for i in range(9)]
    finally:
        consumer.close()
