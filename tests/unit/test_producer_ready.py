"""Waiting for a new producer to be able to deliver before the stream's clock starts: the wait
ends on librdkafka's statistics saying the producer id is assigned, never before; ``SampleProducer`` sends
nothing before that. A fake client stands in for librdkafka (no broker)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, KafkaException

import services.producer.stream as producer_module
from ferret_core.data import Dataset
from services.config import KafkaSettings, ProducerSettings
from services.producer.ready import STATS_INTERVAL_MS, ProducerReadiness
from services.producer.stream import SampleProducer


def stats(state: str) -> str:
    return json.dumps({"name": "fake", "eos": {"idemp_state": state}})


class FakeClient:
    """Reports the idempotence states ``states`` in turn, one per ``poll`` (as librdkafka's statistics
    callback, served from ``poll``); ``events`` records what was called, in order."""

    def __init__(self, config: dict[str, Any], states: list[str], events: list[str]) -> None:
        self.config = config
        self.states = list(states)
        self.events = events
        self.failing_metadata = 0
        self.error: KafkaError | None = None
        self.pending: list[Callable[[], None]] = []

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> Any:
        self.events.append("metadata")
        if self.failing_metadata:
            self.failing_metadata -= 1
            raise KafkaException(KafkaError(KafkaError._TRANSPORT))
        return _Metadata(topic)

    def poll(self, timeout: float = 0) -> int:
        time.sleep(min(timeout, 0.01))  # as a poll with nothing to serve waits
        if self.error is not None and "error_cb" in self.config:
            self.config["error_cb"](self.error)
        if self.states and "stats_cb" in self.config:
            state = self.states.pop(0)
            self.events.append(f"stats:{state}")
            self.config["stats_cb"](stats(state))
        served, self.pending = self.pending, []
        for deliver in served:
            deliver()
        return len(served)

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any, headers: Any) -> None:
        self.events.append("produce")
        self.pending.append(lambda: on_delivery(None, _Delivered(topic)))

    def flush(self, timeout: float = -1) -> int:
        self.poll(0)
        return 0


class _Metadata:
    def __init__(self, topic: str | None) -> None:
        self.topics = {topic: _Topic()} if topic else {}


class _Topic:
    def __init__(self) -> None:
        self.partitions = {0: object()}


class _Delivered:
    def __init__(self, topic: str) -> None:
        self._topic = topic

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 0


def made(client_config: dict[str, Any], states: list[str], events: list[str]) -> FakeClient:
    readiness_config = ProducerReadiness(client_config).client_config()
    return FakeClient({**client_config, **readiness_config}, states, events)


def test_the_wait_ends_only_when_the_producer_id_is_assigned() -> None:
    config = {"enable.idempotence": True}
    readiness = ProducerReadiness(config)
    events: list[str] = []
    client = FakeClient(
        {**config, **readiness.client_config()}, ["Init", "WaitTransport", "WaitPID", "Assigned"], events
    )
    result = readiness.wait(client, "t.samples", timeout_s=30)
    assert result.ready and result.state == "Assigned" and readiness.assigned
    assert events[0] == "metadata"  # the metadata request comes first: its reply asks for the id again
    assert events[-1] == "stats:Assigned"  # and nothing ended the wait before the id was there
    assert client.states == []


def test_metadata_is_asked_for_again_while_no_id_comes() -> None:
    config = {"enable.idempotence": True}
    readiness = ProducerReadiness(config)
    events: list[str] = []
    client = FakeClient({**config, **readiness.client_config()}, ["WaitTransport"] * 40 + ["Assigned"], events)
    assert readiness.wait(client, "t.samples", timeout_s=30).ready
    assert events.count("metadata") >= 2


def test_a_failed_metadata_request_is_retried() -> None:
    config = {"enable.idempotence": True}
    readiness = ProducerReadiness(config)
    client = FakeClient({**config, **readiness.client_config()}, ["Assigned"], [])
    client.failing_metadata = 2
    assert readiness.wait(client, "t.samples", timeout_s=30).ready


def test_not_idempotent_is_ready_with_the_metadata() -> None:
    readiness = ProducerReadiness({"enable.idempotence": "false"})
    assert not readiness.idempotent
    result = readiness.wait(FakeClient({}, [], []), "t.samples", timeout_s=30)
    assert result.ready and result.state is None


def test_no_id_within_the_timeout_says_so() -> None:
    config = {"enable.idempotence": True}
    readiness = ProducerReadiness(config)
    client = FakeClient({**config, **readiness.client_config()}, ["WaitTransport"] * 10_000, [])
    result = readiness.wait(client, "t.samples", timeout_s=0.05)
    assert not result.ready and "no producer id" in result.reason and result.state == "WaitTransport"


def test_every_broker_down_or_a_stop_ends_the_wait() -> None:
    config = {"enable.idempotence": True}
    readiness = ProducerReadiness(config)
    client = FakeClient({**config, **readiness.client_config(), "error_cb": readiness.note_error}, ["Init"] * 10, [])
    client.error = KafkaError(KafkaError._ALL_BROKERS_DOWN)
    client.failing_metadata = 1
    assert readiness.wait(client, "t.samples", timeout_s=30).reason == "all brokers down"

    stop = threading.Event()
    stop.set()
    again = ProducerReadiness(config)
    result = again.wait(FakeClient({**config, **again.client_config()}, ["Assigned"], []), "t", stop=stop)
    assert (result.ready, result.reason) == (False, "stopped")


def test_the_configurations_statistics_settings_are_kept() -> None:
    seen: list[str] = []
    readiness = ProducerReadiness({"enable.idempotence": True, "statistics.interval.ms": 1000, "stats_cb": seen.append})
    assert readiness.client_config()["statistics.interval.ms"] == 1000
    readiness.on_stats(stats("Assigned"))
    assert readiness.assigned and seen == [stats("Assigned")]
    assert ProducerReadiness({}).client_config()["statistics.interval.ms"] == STATS_INTERVAL_MS

    off = ProducerReadiness({"enable.idempotence": True, "statistics.interval.ms": 0})
    result = off.wait(FakeClient({}, [], []), "t.samples", timeout_s=30)
    assert result.ready and "statistics off" in result.reason


def tiny_dataset() -> Dataset:
    x = np.zeros((4, 2, 2), dtype=np.uint8)
    y = np.arange(4, dtype=np.int64) % 2
    return Dataset("tiny", x, y, x, y, input_shape=(2, 2), num_classes=2)


@pytest.mark.parametrize("rate", [None, 1000.0])
def test_sample_producer_sends_nothing_before_its_client_is_ready(
    monkeypatch: pytest.MonkeyPatch, rate: float | None
) -> None:
    events: list[str] = []
    clients: list[FakeClient] = []

    def fake_producer(config: dict[str, Any]) -> FakeClient:
        client = FakeClient(config, ["Init", "WaitTransport", "WaitPID", "Assigned"], events)
        clients.append(client)
        return client

    monkeypatch.setattr(producer_module, "Producer", fake_producer)
    kafka = KafkaSettings(bootstrap_servers="127.0.0.1:9", topic_prefix="t", sample_partitions=1)
    report = SampleProducer(tiny_dataset(), kafka, ProducerSettings(items=3, rate=rate), create_topics=False).run()
    assert report.ok and report.delivered == 3 and report.ready
    assert events.index("stats:Assigned") < events.index("produce")
    assert "stats_cb" in clients[0].config and clients[0].config["enable.idempotence"] is True
