"""The trainer's service path against a real broker (Tansu) and Redis (Valkey): counts by consuming the
topics, DLQ, snapshots, restart and crash recovery (DESIGN §4 stream semantics)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
import redis
from confluent_kafka import Producer

from services.config import Settings
from services.kafka.admin import TopicNames, count_distinct, ensure_topics
from services.kafka.record_codec import DLQ_REASON, SampleDecoder, encode_sample
from services.snapshots import SnapshotStore
from services.trainer.runner import TrainerParts, assemble

from .trainer_support import LinearLearner, produce_digits, read_predictions, settings_for

pytestmark = pytest.mark.integration


def wait_for(condition: Callable[[], bool], timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


class LocalTrainer:
    """A trainer's parts around a :class:`LinearLearner`, as ``ferret run`` assembles them."""

    def __init__(self, settings: Settings, parts: TrainerParts) -> None:
        self.settings = settings
        self.parts = parts
        self.learner = parts.learner
        self.status = parts.port.status
        self.save_snapshot = parts.port.save_snapshot
        self.restore_latest = parts.restore_latest


class Running:
    """A trainer's record path on its own thread."""

    def __init__(self, trainer: LocalTrainer) -> None:
        self.trainer = trainer
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.trainer.parts.stream.run(self.stop)
        except BaseException as exc:
            self.error = exc

    def close(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


@pytest.fixture
def stack(bootstrap_servers: str, redis_url: str, topic_prefix: str) -> Iterator[tuple[str, str, str]]:
    ensure_topics(bootstrap_servers, topic_prefix, sample_partitions=2)
    yield bootstrap_servers, redis_url, topic_prefix


def make_trainer(
    bootstrap: str, redis_url: str, prefix: str, namespace: str | None = None, **kw: object
) -> LocalTrainer:
    settings = settings_for(bootstrap, redis_url, prefix)
    if namespace is not None:
        settings = type(settings)(
            **{
                **settings.__dict__,
                "redis": type(settings.redis)(**{**settings.redis.__dict__, "namespace": namespace}),
            }
        )
    client = redis.Redis.from_url(redis_url)
    store = SnapshotStore(client, settings.redis.namespace, settings.kafka.resolved_instance_id())
    parts = assemble(settings, LinearLearner(64, 10), SampleDecoder((1, 8, 8), 10), store, **kw)  # type: ignore[arg-type]
    return LocalTrainer(settings, parts)


def bad_records(bootstrap: str, topic: str) -> None:
    import numpy as np

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, b"\x08\x96\x01not-a-sample", key=b"bad-1")
    wrong = encode_sample(np.zeros((3, 8, 8), np.uint8), stream="bad", sequence=1, label=1)  # not resizable
    producer.produce(topic, wrong.SerializeToString(), key=b"bad-2")
    nan = encode_sample(np.full((1, 8, 8), np.nan, np.float32), stream="bad", sequence=2, label=1)
    producer.produce(topic, nan.SerializeToString(), key=b"bad-3")
    out_of_range = encode_sample(np.zeros((1, 8, 8), np.uint8), stream="bad", sequence=3, label=42)
    producer.produce(topic, out_of_range.SerializeToString(), key=b"bad-4")
    producer.flush(10)


def test_every_item_gets_one_prediction_and_bad_records_go_to_the_dlq(stack: tuple[str, str, str]) -> None:
    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    ids = produce_digits(bootstrap, topics.samples, 150)
    bad_records(bootstrap, topics.samples)
    ids += produce_digits(bootstrap, topics.samples, 50, start=150)
    trainer = make_trainer(bootstrap, redis_url, prefix)
    running = Running(trainer)
    wait_for(lambda: trainer.status().predictions_published >= 200)
    running.close()

    predictions = read_predictions(bootstrap, topics.predictions, 200)
    assert sorted(p.sample_id for p in predictions) == sorted(ids)  # exactly one each, no gaps
    assert not any(p.duplicate for p in predictions)
    assert sorted(p.item for p in predictions) == list(range(200))  # the trainer's own counter i
    dlq = count_distinct(bootstrap, topics.dlq)
    assert dlq.distinct == 4
    status = trainer.status()
    assert dict(status.dead_lettered) == {
        "undecodable": 1,
        "wrong_shape": 1,
        "non_finite": 1,
        "label_out_of_range": 1,
    }
    assert status.backward_passes == 200 and status.online_accuracy > 0
    assert status.last_snapshot_version >= 1  # snapshot on stop


def test_dlq_messages_carry_reason_and_origin(stack: tuple[str, str, str]) -> None:
    from confluent_kafka import Consumer

    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    bad_records(bootstrap, topics.samples)
    trainer = make_trainer(bootstrap, redis_url, prefix)
    running = Running(trainer)
    wait_for(lambda: sum(trainer.status().dead_lettered.values()) >= 4)
    running.close()
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dlq-{prefix}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe([topics.dlq])
    reasons: Counter[str] = Counter()
    deadline = time.monotonic() + 20
    while sum(reasons.values()) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None or message.error():
            continue
        headers = dict(message.headers() or [])
        reasons[headers[DLQ_REASON].decode()] += 1
        assert headers["ferret.dlq.topic"].decode() == topics.samples
        assert message.value()  # the original bytes
    consumer.close()
    assert sum(reasons.values()) == 4


def test_restart_resumes_from_the_snapshot_with_nothing_lost(stack: tuple[str, str, str]) -> None:
    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    first_ids = produce_digits(bootstrap, topics.samples, 120)
    first = make_trainer(bootstrap, redis_url, prefix)
    running = Running(first)
    wait_for(lambda: first.status().predictions_published >= 120)
    running.close()
    saved = first.learner.state_tensors()

    second = make_trainer(bootstrap, redis_url, prefix, namespace=first.settings.redis.namespace)
    info = second.restore_latest()
    assert info is not None and info.version >= 1
    restored = second.learner.state_tensors()
    for name, tensor in saved.items():
        assert restored[name].equal(tensor)  # restored weights equal saved ones
    new_ids = produce_digits(bootstrap, topics.samples, 40, start=120)
    running = Running(second)
    wait_for(lambda: second.status().items_valid >= 160)
    running.close()
    predictions = read_predictions(bootstrap, topics.predictions, 160)
    assert {p.sample_id for p in predictions} == set(first_ids) | set(new_ids)
    assert len(predictions) == 160  # a clean stop and restart re-emits nothing


def test_crash_after_a_snapshot_replays_only_what_follows_it_flagged(stack: tuple[str, str, str]) -> None:
    bootstrap, redis_url, prefix = stack
    topics = TopicNames(prefix)
    ids = produce_digits(bootstrap, topics.samples, 100)
    first = make_trainer(bootstrap, redis_url, prefix, snapshot_on_stop=False)
    running = Running(first)
    wait_for(lambda: first.status().predictions_published >= 100)
    first.save_snapshot({"reason": "test"})
    ids += produce_digits(bootstrap, topics.samples, 60, start=100)
    wait_for(lambda: first.status().predictions_published >= 160)
    time.sleep(2.5)  # let auto-commit record the stored offsets, as a long-running trainer would
    running.close()  # "crash": no final snapshot

    second = make_trainer(bootstrap, redis_url, prefix, namespace=first.settings.redis.namespace)
    assert second.restore_latest() is not None
    running = Running(second)
    wait_for(lambda: second.status().duplicates_published >= 60)  # counters continue from the snapshot
    running.close()
    predictions = read_predictions(bootstrap, topics.predictions, 220)
    seen = Counter(p.sample_id for p in predictions)
    assert set(seen) == set(ids)  # nothing lost
    replayed = [p for p in predictions if seen[p.sample_id] > 1 and p.duplicate]
    assert len(replayed) == 60  # the items after the snapshot, re-emitted and flagged
    assert all(p.sequence >= 100 for p in replayed)
    assert not any(p.duplicate for p in predictions if p.sequence < 100)
