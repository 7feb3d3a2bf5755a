"""Resuming consumption wakes librdkafka's fetcher (``services/kafka/fetch_wake.py``): after
``resume()`` one request goes to the resumed partitions' leaders, a failed request only logs, and the
trainer's loop-call pause resumes through it."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicPartition

from services.kafka.fetch_wake import resume_and_wake, wake_fetcher
from tests.unit.test_trainer_stream import TOPICS, FakeConsumer, FakeProducer, ScriptedLearner, parts_for

ASSIGNED = [TopicPartition(TOPICS.samples, 0, 5), TopicPartition(TOPICS.labels, 0, 2)]


@dataclass
class RecordingConsumer(FakeConsumer):
    """A consumer that owns ``ASSIGNED`` and notes its pause / resume / offsets requests in order."""

    calls: list[tuple[str, list[tuple[str, int, int]]]] = field(default_factory=list)
    fail_offsets: bool = False

    def assignment(self) -> list[TopicPartition]:  # type: ignore[override]
        return list(ASSIGNED)

    def _note(self, what: str, partitions: list[TopicPartition]) -> None:
        self.calls.append((what, [(tp.topic, tp.partition, tp.offset) for tp in partitions]))

    def pause(self, partitions: list[TopicPartition]) -> None:
        self._note("pause", partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        self._note("resume", partitions)

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = -1) -> list[TopicPartition]:
        self._note("offsets_for_times", partitions)
        if self.fail_offsets:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        return partitions


def test_resume_then_one_request_to_the_resumed_partitions_leaders() -> None:
    consumer = RecordingConsumer()
    assert resume_and_wake(consumer, ASSIGNED)
    assert [what for what, _ in consumer.calls] == ["resume", "offsets_for_times"]
    # the request names each resumed partition, asking for its latest offset (not the consumer's position)
    assert consumer.calls[1][1] == [(TOPICS.samples, 0, OFFSET_END), (TOPICS.labels, 0, OFFSET_END)]


def test_a_failed_wake_request_is_not_an_error_and_nothing_is_asked_without_partitions() -> None:
    consumer = RecordingConsumer(fail_offsets=True)
    assert not resume_and_wake(consumer, ASSIGNED)  # logged; the fetcher then starts at its idle timeout
    empty = RecordingConsumer()
    assert not wake_fetcher(empty, [])
    assert empty.calls == []
    assert wake_fetcher(RecordingConsumer())  # default: the consumer's assignment


def test_the_trainers_loop_call_pause_resumes_and_wakes_the_fetcher() -> None:
    parts, _, _ = parts_for(ScriptedLearner())
    consumer = RecordingConsumer()
    parts.stream.connect(consumer, FakeProducer())  # type: ignore[arg-type]
    with parts.stream.paused():
        assert [what for what, _ in consumer.calls] == ["pause"]
    assert [what for what, _ in consumer.calls] == ["pause", "resume", "offsets_for_times"]
    assert parts.stream.counters.pauses == 1
