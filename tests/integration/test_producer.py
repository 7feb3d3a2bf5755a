"""The producer against the embedded broker: counts read back by consuming (never from watermarks),
delayed labels, pacing, and ``ferret produce`` as a process (exit statuses, clean stop on SIGTERM)."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Message

from ferret_core.data import Dataset, load_dataset
from services.config import KafkaSettings, ProducerSettings
from services.kafka import TopicNames, count_distinct
from services.kafka.rate_headers import declared_interval
from services.kafka.record_codec import SampleDecoder, ValidSample, now_ms
from services.producer.stream import SampleProducer
from services.proto_gen.ferret.v1.messages_pb2 import Label, Sample

pytestmark = pytest.mark.integration

FERRET = Path(sys.executable).with_name("ferret")
REPO = Path(__file__).resolve().parents[2]


@functools.cache
def digits() -> Dataset:
    return load_dataset("digits", None)


def kafka(bootstrap_servers: str, prefix: str, partitions: int = 3) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=bootstrap_servers, topic_prefix=prefix, sample_partitions=partitions)


def sample_id_of(message: Message) -> str:
    return str(Sample.FromString(message.value() or b"").id)


def test_every_item_arrives_once_spread_over_partitions(bootstrap_servers: str, topic_prefix: str) -> None:
    report = SampleProducer(digits(), kafka(bootstrap_servers, topic_prefix), ProducerSettings(items=500)).run()
    assert report.ok and (report.produced, report.delivered, report.failed) == (500, 500, 0)

    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, id_of=sample_id_of, idle_timeout=1.0)
    assert (count.records, count.distinct, count.undecodable) == (500, 500, 0)
    assert len([p for p, n in count.per_partition.items() if n > 0]) >= 2
    assert count.per_partition == report.per_partition


def test_records_decode_as_valid_samples_keyed_by_id(bootstrap_servers: str, topic_prefix: str) -> None:
    SampleProducer(digits(), kafka(bootstrap_servers, topic_prefix, 1), ProducerSettings(items=20)).run()
    decoder = SampleDecoder(digits().input_shape, digits().num_classes)

    def check(message: Message) -> str:
        decoded = decoder.decode(message.value())
        assert isinstance(decoded, ValidSample), decoded
        assert message.key() == decoded.sample_id.encode()
        assert decoded.label == int(digits().y_train[decoded.sequence])
        return decoded.sample_id

    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, id_of=check, idle_timeout=1.0)
    assert (count.distinct, count.undecodable) == (20, 0)


def test_delayed_labels_arrive_once_each_on_the_labels_topic(bootstrap_servers: str, topic_prefix: str) -> None:
    options = ProducerSettings(items=120, labels="delayed", label_delay_s=0.3)
    report = SampleProducer(digits(), kafka(bootstrap_servers, topic_prefix), options).run()
    assert report.ok and (report.labels_produced, report.labels_delivered) == (120, 120)

    names = TopicNames(topic_prefix)
    labels = count_distinct(
        bootstrap_servers, names.labels, id_of=lambda m: Label.FromString(m.value() or b"").sample_id, idle_timeout=1.0
    )
    assert (labels.records, labels.distinct) == (120, 120)
    unlabelled = count_distinct(
        bootstrap_servers,
        names.samples,
        id_of=lambda m: None if Sample.FromString(m.value() or b"").HasField("label") else m.key(),
        idle_timeout=1.0,
    )
    assert (unlabelled.distinct, unlabelled.unkeyed) == (120, 0)  # no sample carries its label


def test_rate_pacing_holds_items_back(bootstrap_servers: str, topic_prefix: str) -> None:
    producer = SampleProducer(
        digits(), kafka(bootstrap_servers, topic_prefix, 1), ProducerSettings(items=200, rate=400.0)
    )
    began = time.monotonic()
    report = producer.run()
    assert report.delivered == 200
    assert time.monotonic() - began >= 0.45  # 199 intervals of 2.5 ms; only the lower bound is behaviour


def test_a_paced_stream_declares_its_rate_in_every_sample_record(bootstrap_servers: str, topic_prefix: str) -> None:
    settings = kafka(bootstrap_servers, topic_prefix, 2)
    SampleProducer(digits(), settings, ProducerSettings(items=30, rate=500.0)).run()
    declared: list[float | None] = []

    def interval(message: Message) -> str:
        declared.append(declared_interval(message.headers(), owned=1))
        return sample_id_of(message)

    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, id_of=interval, idle_timeout=1.0)
    assert count.distinct == 30
    assert declared == [pytest.approx(2 / 500.0)] * 30  # a trainer owning 1 of the 2 partitions gets half


def test_the_stream_starts_once_the_client_has_its_producer_id(bootstrap_servers: str, topic_prefix: str) -> None:
    """The first event time is stamped after the wait for the producer id, not before it."""
    before_ms = now_ms()
    report = SampleProducer(
        digits(), kafka(bootstrap_servers, topic_prefix, 1), ProducerSettings(items=5, rate=100.0)
    ).run()
    assert report.ok and report.ready and report.ready_s > 0
    events: list[int] = []

    def event_time(message: Message) -> str:
        events.append(Sample.FromString(message.value() or b"").event_time_ms)
        return sample_id_of(message)

    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, id_of=event_time, idle_timeout=1.0)
    assert count.distinct == 5
    assert min(events) >= before_ms + int(report.ready_s * 1000)


def _cli(*args: str, **kwargs: object) -> list[str]:
    return [str(FERRET), "produce", "--dataset", "digits", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FERRET_")}


def test_cli_produces_and_prints_the_final_count(bootstrap_servers: str, topic_prefix: str) -> None:
    command = _cli("--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix, "--items", "100")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=_env())
    assert done.returncode == 0, done.stderr
    assert f"produced 100 samples to {topic_prefix}.samples: delivered 100, failed 0" in done.stdout
    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, idle_timeout=1.0)
    assert count.distinct == 100


def test_cli_stops_cleanly_on_sigterm(bootstrap_servers: str, topic_prefix: str) -> None:
    command = _cli(
        "--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix, "--loop", "--rate", "500", "--quiet"
    )
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    try:
        assert process.stderr is not None
        line = process.stderr.readline()  # printed once SIGTERM stops it cleanly
        assert line.startswith("producing digits (until stopped"), line
        time.sleep(0.5)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "stopped early" in out
    delivered = int(out.split("delivered ")[1].split(",")[0])
    count = count_distinct(bootstrap_servers, TopicNames(topic_prefix).samples, idle_timeout=1.0)
    assert delivered > 0 and count.distinct == delivered


def test_cli_exits_1_with_a_reason_when_deliveries_fail() -> None:
    env = {**_env(), "FERRET_KAFKA_PROPERTIES": '{"message.timeout.ms": 500}'}
    command = _cli("--bootstrap-servers", "127.0.0.1:9", "--items", "5", "--no-create-topics", "--quiet")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 1
    assert "delivered 0, failed 5" in done.stdout
    reasons = [line for line in done.stderr.splitlines() if line.startswith("ferret: error:")]
    assert reasons == [
        "ferret: error: 5 of 5 samples were not delivered: ferret.samples: _MSG_TIMED_OUT: Local: Message timed out"
    ]
