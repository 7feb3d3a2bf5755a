"""The trainer's reliability parts without services: the publisher's too-large, full-queue
and fatal-error handling, poison records, the outcome positions committed with offsets, duplicates flagged
from published outcomes, and the lag reading. The reliability tier runs them against the real broker."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from confluent_kafka import KafkaError, KafkaException

from services.kafka.record_codec import SampleDecoder, dead_letter_info
from services.trainer.failures import ErrorPolicy, MemoryFailureLog, RecordFailure, RecordPathStopped, Step
from services.trainer.lag import UNKNOWN, PartitionLag
from services.trainer.outcomes import OutcomePositions, OutcomeTopics
from services.trainer.publisher import MessageTooLarge, Publisher, Reissue
from services.trainer.runner import assemble
from tests.unit.test_trainer_stream import (
    SETTINGS,
    TOPICS,
    Delivered,
    FakeConsumer,
    FakeMessage,
    FakeProducer,
    ScriptedLearner,
    parts_for,
    predictions,
    sample,
)


@dataclass
class ScriptedProducer:
    """Raises what ``script`` says at each produce (None: accept); deliveries on poll, in order."""

    script: list[BaseException | None] = field(default_factory=list)
    queued: list[tuple[str, Callable[..., None]]] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    purged: int = 0

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, **kw: object) -> None:
        error = self.script.pop(0) if self.script else None
        if error is not None:
            raise error
        self.queued.append((topic, kw["on_delivery"]))  # type: ignore[arg-type]

    def poll(self, timeout: float = 0) -> int:
        queued, self.queued = self.queued, []
        for topic, callback in queued:
            self.sent.append(topic)
            callback(None, Delivered(topic, 0, len(self.sent) - 1))
        return len(queued)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        self.purged += 1
        queued, self.queued = self.queued, []
        for _, callback in queued:
            callback(KafkaError(KafkaError._PURGE_QUEUE), None)


def kafka_error(code: int, *, fatal: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, "scripted", fatal=fatal))


def test_the_publisher_says_too_large_and_retries_a_full_queue() -> None:
    producer = ScriptedProducer([kafka_error(KafkaError.MSG_SIZE_TOO_LARGE), BufferError(), None])
    publisher = Publisher(lambda _cb: producer)
    got: list[object] = []
    with pytest.raises(MessageTooLarge):
        publisher.send("t", b"x" * 10, key=None, on_delivery=lambda e, m: got.append(e))
    publisher.send("t", b"x", key=None, on_delivery=lambda e, m: got.append(e))  # full once, then accepted
    publisher.poll()
    assert got == [None] and producer.sent == ["t"]


def test_a_fatal_error_rebuilds_the_producer_and_resends_in_order() -> None:
    first = ScriptedProducer()
    second = ScriptedProducer()
    made = iter([first, second])
    callbacks: list[Callable[[KafkaError], None]] = []

    def make(error_cb: Callable[[KafkaError], None]) -> ScriptedProducer:
        callbacks.append(error_cb)
        return next(made)

    publisher = Publisher(make)
    delivered: list[str] = []
    for name in ("a", "b"):
        publisher.send(
            name, b"v", key=None, on_delivery=lambda e, m, n=name: delivered.append(n) if e is None else None
        )
    callbacks[0](KafkaError(KafkaError._FATAL, "idempotence sequence lost", fatal=True))  # librdkafka's error_cb
    first.script = [kafka_error(KafkaError._FATAL, fatal=True)]
    publisher.send("c", b"v", key=None, on_delivery=lambda e, m: delivered.append("c") if e is None else None)
    publisher.poll()
    assert publisher.rebuilds == 1 and first.purged == 1
    assert second.sent == ["a", "b", "c"] and delivered == ["a", "b", "c"]  # nothing lost, order kept


Queued = tuple[str, bytes | None, object, Callable[..., None]]  # topic, value, headers, delivery callback


@dataclass
class DyingProducer:
    """librdkafka's idempotent producer as measured when a restarted broker handed its producer id to
    another client (services/trainer/publisher.py): until :meth:`die` every poll delivers, in order; after
    it the refused batch is reported with ``OUT_OF_ORDER_SEQUENCE_NUMBER`` (``fatal()`` False) at the next
    poll, which then raises the fatal error (``fatal()`` True) once, and every ``produce()`` raises
    ``_FATAL`` (``fatal()`` False; ``fatal_produce`` makes it True). ``purge`` reports what it still holds:
    the local queue ``_PURGE_QUEUE``, what was sent without an answer ``_PURGE_INFLIGHT``."""

    fatal_produce: bool = False
    queued: list[Queued] = field(default_factory=list)  # produced, not sent to the broker yet
    in_flight: list[Queued] = field(default_factory=list)  # sent, no answer yet
    refused: list[Queued] = field(default_factory=list)  # the broker's answer: out of order (served by poll)
    delivered: list[tuple[str, bytes | None]] = field(default_factory=list)
    headers: list[object] = field(default_factory=list)
    dead: bool = False
    raised: bool = False

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, **kw: object) -> None:
        if self.dead:
            raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=self.fatal_produce))
        self.queued.append((topic, value, kw.get("headers"), kw["on_delivery"]))  # type: ignore[arg-type]

    def send_batch(self) -> None:
        """librdkafka sends what is queued; the broker has not answered yet."""
        self.in_flight, self.queued = [*self.in_flight, *self.queued], []

    def die(self, refused: int) -> None:
        """The broker refuses the first ``refused`` in-flight messages: the producer is dead."""
        self.refused, self.in_flight = self.in_flight[:refused], self.in_flight[refused:]
        self.dead = True

    def poll(self, timeout: float = 0) -> int:
        if self.dead:
            refused, self.refused = self.refused, []
            for *_, callback in refused:
                callback(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence desynchronization"), None)
            if not self.raised:
                self.raised = True
                raise KafkaException(KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "fatal", fatal=True))
            return len(refused)
        served, self.in_flight, self.queued = [*self.in_flight, *self.queued], [], []
        for topic, value, headers, callback in served:
            self.delivered.append((topic, value))
            self.headers.append(headers)
            callback(None, Delivered(topic, 0, len(self.delivered) - 1))
        return len(served)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None:
        for held, code in ((self.queued, KafkaError._PURGE_QUEUE), (self.in_flight, KafkaError._PURGE_INFLIGHT)):
            for *_, callback in held:
                callback(KafkaError(code), None)
            held.clear()


def _sender(publisher: Publisher, reports: dict[str, list[object]]) -> Callable[[str], None]:
    """Sends a message named ``name`` (value ``name``, flagged copy ``name*``); its reports (None: delivered)
    go to ``reports[name]``, the flagged copy's to ``reports[name + "*"]``."""

    def send(name: str) -> None:
        def report(key: str) -> Callable[[KafkaError | None, object], None]:
            return lambda error, _message: reports.setdefault(key, []).append(error)

        publisher.send(
            "t", name.encode(), key=None, on_delivery=report(name),
            flagged=lambda: Reissue(f"{name}*".encode(), None, report(f"{name}*")),
        )  # fmt: skip

    return send


@pytest.mark.parametrize("fatal_produce", [False, True], ids=["as-librdkafka-reports-it", "fatal-flag-set"])
def test_a_fatal_error_raised_by_produce_rebuilds_and_loses_nothing(fatal_produce: bool) -> None:
    """The issue's path: the producer died, no poll has told the publisher yet, and the next ``produce()``
    raises ``_FATAL``. The producer is rebuilt and every message is delivered once, in order: the one the
    broker refused and the one never sent as they were, the one in flight as its flagged copy."""
    first, second = DyingProducer(fatal_produce=fatal_produce), DyingProducer()
    made = iter([first, second])
    publisher = Publisher(lambda _cb: next(made))
    reports: dict[str, list[object]] = {}
    send = _sender(publisher, reports)
    send("a")
    send("b")
    first.send_batch()  # a and b in flight
    send("c")  # queued
    first.die(refused=1)  # the broker refuses a (out of order); b's answer never comes
    send("d")  # produce() raises _FATAL: rebuilt, a b c resent, then d
    publisher.poll()
    assert publisher.rebuilds == 1 and (publisher.resent, publisher.resent_flagged) == (3, 1)
    assert second.delivered == [("t", b"a"), ("t", b"b*"), ("t", b"c"), ("t", b"d")]
    assert reports == {"a": [None], "b*": [None], "c": [None], "d": [None]}  # one report each, no error


def test_a_fatal_error_raised_by_poll_rebuilds_and_resends_the_refused_batch() -> None:
    """The order measured on the embedded broker: the refused batch's reports (``fatal()`` False), then
    ``poll()`` raising the fatal error. Nothing escapes the publisher and nothing is lost or flagged (the
    broker refused the batch: no copy of it is on the topic)."""
    first, second = DyingProducer(), DyingProducer()
    made = iter([first, second])
    publisher = Publisher(lambda _cb: next(made))
    reports: dict[str, list[object]] = {}
    send = _sender(publisher, reports)
    send("a")
    send("b")
    first.send_batch()
    first.die(refused=2)
    publisher.poll()  # reports, then the raise: rebuilt and resent
    publisher.poll()
    assert publisher.rebuilds == 1 and (publisher.resent, publisher.resent_flagged) == (2, 0)
    assert second.delivered == [("t", b"a"), ("t", b"b")] and reports == {"a": [None], "b": [None]}


def test_outcomes_resent_after_a_rebuild_are_flagged_duplicates_and_finish_their_offsets() -> None:
    """Through the record path: a prediction and a dead letter in flight when the producer died are resent
    flagged (``duplicate=true``, ``ferret.dlq.duplicate: true``) and counted; the next prediction is not;
    every offset is finished once."""
    first, second = DyingProducer(), DyingProducer()
    made = iter([first, second])
    parts = assemble(SETTINGS, ScriptedLearner(), SampleDecoder((1, 8, 8), 10), None)  # type: ignore[arg-type]
    parts.stream.connect(FakeConsumer(), producer_factory=lambda _cb: next(made))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, sample(0)))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 1, b"junk"))  # type: ignore[arg-type]  # dead letter
    first.send_batch()
    first.die(refused=0)  # both in flight, never answered
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 2, sample(2)))  # type: ignore[arg-type]
    parts.stream.flush(1.0)
    assert [(p.source_offset, p.duplicate) for p in predictions(second)] == [(0, True), (2, False)]  # type: ignore[arg-type]
    dlq = [h for (topic, _), h in zip(second.delivered, second.headers, strict=True) if topic == TOPICS.dlq]
    assert [dict(h).get("ferret.dlq.duplicate") for h in dlq] == [b"true"]  # type: ignore[arg-type]
    assert parts.port.status().duplicates_published == 1  # the prediction's flagged copy
    assert parts.stream.ledger.resume_offsets() == {0: 3}


@dataclass
class SilentProducer(ScriptedProducer):
    """Accepts every message and never reports a delivery (librdkafka's epoch-bump loop against a broker
    that lost its producer ids)."""

    def poll(self, timeout: float = 0) -> int:
        return 0


def test_a_producer_that_reports_nothing_for_the_stall_time_is_rebuilt() -> None:
    stuck, fresh = SilentProducer(), ScriptedProducer()
    made = iter([stuck, fresh])
    publisher = Publisher(lambda _cb: next(made), stall_s=0.05)
    delivered: list[str] = []
    for name in ("a", "b"):
        publisher.send(
            name, b"v", key=None, on_delivery=lambda e, m, n=name: delivered.append(n) if e is None else None
        )
    publisher.poll()
    assert publisher.rebuilds == 0  # not stalled yet
    time.sleep(0.1)
    publisher.poll()  # stalled: rebuilt, both sent again in order
    publisher.poll()
    assert publisher.rebuilds == 1 and stuck.purged == 1
    assert fresh.sent == ["a", "b"] and delivered == ["a", "b"]
    time.sleep(0.1)
    publisher.poll()
    assert publisher.rebuilds == 1  # nothing outstanding: idle is not a stall


def test_a_prediction_too_large_for_the_producer_is_dead_lettered_and_the_stream_goes_on() -> None:
    producer = FakeProducer()
    parts, producer, _ = parts_for(ScriptedLearner(), producer)
    real = producer.produce
    calls = {"n": 0}

    def produce(topic: str, value: bytes, **kw: object) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise kafka_error(KafkaError.MSG_SIZE_TOO_LARGE)
        real(topic, value, **kw)  # type: ignore[arg-type]

    producer.produce = produce  # type: ignore[method-assign]
    for offset in (0, 1):
        parts.stream.process(FakeMessage(TOPICS.samples, 0, offset, sample(offset)))  # type: ignore[arg-type]
    producer.poll()
    assert [t for t, _ in producer.delivered] == [TOPICS.dlq, TOPICS.predictions]
    assert dict(parts.port.status().dead_lettered) == {"too_large": 1}
    assert parts.stream.ledger.resume_offsets() == {0: 2}


def test_a_record_that_stopped_the_trainer_k_times_is_dead_lettered_with_the_error() -> None:
    failures = MemoryFailureLog()  # in production: Redis, so the count outlives each process
    for _ in range(3):  # three processes, each stopped by the record at offset 4
        policy = ErrorPolicy(failures=failures, max_failures=3)
        parts, _, _ = parts_for(ScriptedLearner(error=ValueError("layer exploded on this input")), policy=policy)
        with pytest.raises(RecordPathStopped):
            parts.stream.process(FakeMessage(TOPICS.samples, 0, 4, sample(4)))  # type: ignore[arg-type]
    policy = ErrorPolicy(failures=failures, max_failures=3)
    learner = ScriptedLearner()
    parts, producer, _ = parts_for(learner, policy=policy)
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 4, sample(4)))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 5, sample(5)))  # type: ignore[arg-type]
    producer.poll()
    assert learner.arrived == [0]  # the poison record never reached the learner; the next one did
    [dlq_headers, _] = producer.headers
    info = dead_letter_info(dlq_headers)  # type: ignore[arg-type]
    assert info["reason"] == "poison" and "layer exploded on this input" in info["detail"]
    assert "failed 3 times" in info["detail"]
    assert dict(parts.port.status().dead_lettered) == {"poison": 1}


def test_a_learner_failure_is_blamed_on_the_record_whose_item_failed() -> None:
    from services.trainer.learner import LearnerFailed

    failures = MemoryFailureLog()
    learner = ScriptedLearner()
    parts, _, _ = parts_for(learner, policy=ErrorPolicy(failures=failures))
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 10, sample(0)))  # type: ignore[arg-type]  # item 0
    learner.error = LearnerFailed(0, RuntimeError("backward of item 0 raised"))  # reported by a later arrival
    with pytest.raises(RecordPathStopped):
        parts.stream.process(FakeMessage(TOPICS.samples, 0, 11, sample(1)))  # type: ignore[arg-type]
    assert failures.get(f"{TOPICS.samples}/0/10") is not None and failures.get(f"{TOPICS.samples}/0/11") is None


def test_a_lost_executor_stops_the_trainer_without_blaming_the_record() -> None:
    """An executor process that died (kill -9, OOM) is no record's doing: the trainer stops (its supervisor
    restarts it from the last snapshot) and the record is not counted towards poison."""
    from ferret_core.errors import ExecutorLost
    from services.trainer.learner import LearnerFailed

    failures = MemoryFailureLog()
    cause = ExecutorLost("executor process of worker 0, stage 0 (pid 1) exited with code -9")
    lost = LearnerFailed(0, cause)
    lost.__cause__ = cause  # as the learner raises it (``raise LearnerFailed(...) from cause``)
    for _ in range(4):  # more stops than max_failures: still not poison
        learner = ScriptedLearner(error=lost)
        parts, _, _ = parts_for(learner, policy=ErrorPolicy(failures=failures, max_failures=3))
        with pytest.raises(RecordPathStopped, match="ExecutorLost"):
            parts.stream.process(FakeMessage(TOPICS.samples, 0, 7, sample(7)))  # type: ignore[arg-type]
    assert failures.get(f"{TOPICS.samples}/0/7") is None


def test_rules_by_step_and_reason() -> None:
    policy = ErrorPolicy()
    assert policy.rule(RecordFailure(Step.DELIVER, "t", 0, 0, "too_large", "")).value == "dead_letter"
    assert policy.rule(RecordFailure(Step.DELIVER, "t", 0, 0, "not_delivered", "")).value == "hold"
    assert policy.rule(RecordFailure(Step.DEAD_LETTER, "t", 0, 0, "too_large", "")).value == "skip"


def test_outcome_positions_pair_each_resume_offset_with_where_later_outcomes_can_be() -> None:
    positions = OutcomePositions()
    assert positions.start_for("p", 0, 5) is None  # nothing known: nothing to commit
    positions.known("p", 0, 100)  # what the previous owner committed
    for source, outcome in ((5, 100), (6, 101), (8, 102)):  # offset 7 went to the DLQ
        positions.delivered("p", 0, source, outcome)
    assert positions.start_for("p", 0, 5) == 100
    assert positions.start_for("p", 0, 7) == 102  # outcomes of offsets >= 7 lie at 102 or later
    assert positions.start_for("p", 0, 9) == 103
    topics = OutcomeTopics("s", "p", "d", {"s": 3, "p": 3, "d": 1}, sample_partitions=3)
    assert topics.aligned("p") and not topics.aligned("d") and topics.partition_for("d", 2) == 0


def test_a_re_emitted_outcome_is_flagged_when_it_was_published_before() -> None:
    parts, producer, _ = parts_for(ScriptedLearner())
    parts.stream.ledger.known_predicted(0, 3)  # committed offset: below is flagged
    parts.stream.ledger.published_before(0, {4, 6})  # found by the outcome scan beyond it
    for offset in range(2, 8):
        parts.stream.process(FakeMessage(TOPICS.samples, 0, offset, sample(offset)))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 8, b"junk"))  # type: ignore[arg-type]
    parts.stream.ledger.published_before(0, {9})
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 9, b"junk"))  # type: ignore[arg-type]
    producer.poll()
    assert [p.source_offset for p in predictions(producer) if p.duplicate] == [2, 4, 6]
    dlq = [h for (topic, _), h in zip(producer.delivered, producer.headers, strict=True) if topic == TOPICS.dlq]
    assert [dict(h).get("ferret.dlq.duplicate") for h in dlq] == [None, b"true"]  # type: ignore[arg-type]


def test_commits_carry_the_outcome_positions() -> None:
    parts, producer, consumer = parts_for(ScriptedLearner())
    stream = parts.stream
    stream.partitions.assigned = frozenset({0, 1})
    stream.partitions.outcomes = OutcomeTopics(TOPICS.samples, TOPICS.predictions, TOPICS.dlq,
                                     {TOPICS.samples: 2, TOPICS.predictions: 2, TOPICS.dlq: 2}, 2)  # fmt: skip
    for partition, offset in ((0, 0), (1, 0), (0, 1), (1, 1)):
        stream.process(FakeMessage(TOPICS.samples, partition, offset, sample(offset)))  # type: ignore[arg-type]
    producer.poll()
    stream.partitions.commit()
    committed = set(consumer.commits[-1])
    assert {(TOPICS.samples, 0, 2), (TOPICS.samples, 1, 2)} <= committed
    assert {(TOPICS.predictions, 0, 2), (TOPICS.predictions, 1, 2)} <= committed  # aligned partitions
    stream.partitions.commit()
    assert consumer.committed == 1  # nothing changed: nothing sent


def test_lag_is_zero_when_caught_up_and_never_grows_while_idle() -> None:
    now = [10_000]
    lag = PartitionLag(clock_ms=lambda: now[0])
    lag.assigned([0, 1])
    assert lag.reading().by_partition == {0: UNKNOWN, 1: UNKNOWN}
    lag.consumed(0, 99, event_time_ms=9_000)
    lag.offsets(0, 100, 26_100)  # 26,000 behind
    lag.offsets(1, 5, 3)  # a watermark below the position: implausible
    reading = lag.reading()
    assert reading.by_partition == {0: 26_000, 1: UNKNOWN} and reading.items == 26_000
    assert reading.seconds == 1.0
    lag.end_of_partition(0, 26_100)
    lag.end_of_partition(1, 5)
    now[0] += 600_000  # ten idle minutes
    assert lag.reading() == type(reading)(0, 0.0, {0: 0, 1: 0})
    lag.revoked([1])
    assert lag.reading().by_partition == {0: 0}
