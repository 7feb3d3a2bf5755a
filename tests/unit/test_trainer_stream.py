"""The trainer's record path with in-memory Kafka fakes (the integration tier runs it on the real broker):
one record's steps, the error policy's decisions, offsets finished only when the outcome is durable, the
checkpoints' shutdown sequence under its budget, and the loop-thread hand-over."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from confluent_kafka import KafkaError, TopicPartition

from ferret_core.engine import SkipReason
from ferret_core.engine.policies import sequential_plan
from services.config import load_settings
from services.control.deadline import CallDeadline
from services.control.errors import DeadlineExpired, ServiceUnavailable
from services.kafka.record_codec import SampleDecoder, encode_sample
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.checkpoints import Checkpoints, CheckpointTimeout
from services.trainer.counters import StreamCounters
from services.trainer.failures import Decision, ErrorPolicy, RecordFailure, RecordPathStopped, Step
from services.trainer.learner import ArrivalOutcome, LearnerStats, settled
from services.trainer.loop_calls import LoopCalls
from services.trainer.predictions import DECISIONS
from services.trainer.runner import TrainerParts, assemble

SETTINGS = load_settings(None, env={"FERRET_KAFKA_TOPIC_PREFIX": "t", "FERRET_TRAINER_DATASET": "digits"})
TOPICS = SETTINGS.kafka.topics


@dataclass
class FakeMessage:
    _topic: str
    _partition: int
    _offset: int
    _value: bytes | None
    _key: bytes | None = None
    _error: object = None

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes | None:
        return self._key

    def headers(self) -> list[tuple[str, bytes]]:
        return []

    def error(self) -> object:
        return self._error


@dataclass
class Delivered:
    """The message a delivery report carries (its offset in the topic's partition)."""

    _topic: str
    _partition: int
    _offset: int

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset


@dataclass
class FakeProducer:
    """Queues produced messages; ``poll``/``flush`` deliver them (with ``fail`` as the error, if set)."""

    fail: KafkaError | None = None
    queued: list[tuple[str, bytes, int | None, Callable[..., None]]] = field(default_factory=list)
    delivered: list[tuple[str, bytes]] = field(default_factory=list)
    headers: list[object] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)

    def produce(self, topic: str, value: bytes, key: bytes | None = None, headers: object = None,
                on_delivery: Callable[..., None] | None = None, partition: int | None = None) -> None:  # fmt: skip
        assert on_delivery is not None
        self.queued.append((topic, value, partition, on_delivery))
        self.headers.append(headers)

    def poll(self, timeout: float = 0) -> int:
        queued, self.queued = self.queued, []
        for topic, value, partition, callback in queued:
            if self.fail is None:
                self.delivered.append((topic, value))
                where = (topic, partition or 0)
                self.offsets[where] = offset = self.offsets.get(where, -1) + 1
                callback(None, Delivered(topic, partition or 0, offset))
            else:
                callback(self.fail, None)
        return len(queued)

    def flush(self, timeout: float = 0) -> int:
        self.poll()
        return 0

    def purge(self, in_queue: bool = True, in_flight: bool = True, blocking: bool = True) -> None: ...


@dataclass
class FakeConsumer:
    commits: list[list[tuple[str, int, int]]] = field(default_factory=list)

    @property
    def committed(self) -> int:
        return len(self.commits)

    def assignment(self) -> list[object]:
        return []

    def commit(self, offsets: list[TopicPartition] | None = None, asynchronous: bool = True) -> None:
        self.commits.append(sorted((tp.topic, tp.partition, tp.offset) for tp in offsets or []))


class ScriptedLearner:
    """Predicts class 3; skips with ``skip`` (or dispatches to worker 1); may raise instead."""

    def __init__(self, skip: SkipReason | None = None, error: Exception | None = None) -> None:
        self.skip, self.error = skip, error
        self.plan = sequential_plan("linear", 1, 1.0)
        self.arrived: list[int] = []
        self.drain_timeout: float | None = None
        self.slow_drain = False

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        return settled(self.arrive(item, x, y, event_time_ms))

    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        if self.error is not None:
            raise self.error
        self.arrived.append(item)
        skip = SkipReason.NO_LABEL if y is None else self.skip
        return ArrivalOutcome(3, 0.9, 7, skip, None if skip is not None else 1)

    def pending_training(self) -> bool:
        return False  # trains on threads of its own

    def train_step(self) -> bool:
        return False

    def drain(self, timeout: float | None = None) -> None:
        self.drain_timeout = timeout
        if self.slow_drain:
            raise TimeoutError("still training")

    def compensator_state(self) -> list[dict[str, Any]]:
        return []  # no compensator

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        assert not states

    def stats(self) -> LearnerStats:
        return LearnerStats(backward_passes=0, model_version=7, measured_bytes=0, peak_bytes=0)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None: ...

    def apply_plan(self, plan: object) -> None: ...

    def close(self) -> None: ...


def sample(seq: int, label: int | None = 3) -> bytes:
    x = np.zeros((1, 8, 8), np.uint8)
    return encode_sample(x, stream="digits", sequence=seq, label=label, event_time_ms=1000 + seq).SerializeToString()


def parts_for(
    learner: ScriptedLearner, producer: FakeProducer | None = None, **kw: object
) -> tuple[TrainerParts, FakeProducer, FakeConsumer]:
    parts = assemble(SETTINGS, learner, SampleDecoder((1, 8, 8), 10), None, **kw)  # type: ignore[arg-type]
    producer = producer or FakeProducer()
    consumer = FakeConsumer()
    parts.stream.connect(consumer, producer)  # type: ignore[arg-type]
    return parts, producer, consumer


def predictions(producer: FakeProducer) -> list[messages_pb2.Prediction]:
    out = []
    for topic, value in producer.delivered:
        if topic == TOPICS.predictions:
            message = messages_pb2.Prediction()
            message.ParseFromString(value)
            out.append(message)
    return out


def test_a_record_is_decoded_arrives_and_is_published_with_the_learners_decision() -> None:
    parts, producer, _ = parts_for(ScriptedLearner())
    for seq in range(3):
        parts.stream.process(FakeMessage(TOPICS.samples, 0, 10 + seq, sample(seq)))  # type: ignore[arg-type]
    assert parts.stream.ledger.resume_offsets() == {0: 10}  # nothing durable yet: nothing to store past 10
    producer.poll()
    assert parts.stream.ledger.resume_offsets() == {0: 13}  # delivered: finished
    out = predictions(producer)
    assert [p.item for p in out] == [0, 1, 2] and {p.worker for p in out} == {1}
    assert {p.decision for p in out} == {messages_pb2.TRAINING_DECISION_DISPATCHED}
    assert out[-1].online_accuracy == 100.0 and out[-1].model_version == 7
    status = parts.port.status()
    assert (status.items_valid, status.items_dispatched, status.predictions_published) == (3, 3, 3)
    assert status.labelled_predictions == 3 and status.correct_predictions == 3


def test_a_skip_keeps_the_cores_reason_up_to_the_one_proto_mapping() -> None:
    parts, producer, _ = parts_for(ScriptedLearner(skip=SkipReason.BUSY))
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, sample(0)))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 1, sample(1, label=None)))  # type: ignore[arg-type]
    producer.poll()
    [busy, unlabelled] = predictions(producer)
    assert busy.decision == DECISIONS[SkipReason.BUSY] and busy.worker == -1
    assert unlabelled.decision == DECISIONS[SkipReason.NO_LABEL]
    assert dict(parts.port.status().skipped) == {"busy": 1, "no_label": 1}
    assert set(DECISIONS) == {None, *SkipReason}  # every core reason has exactly one proto value


def test_an_invalid_record_is_dead_lettered_and_finished_on_delivery(caplog: pytest.LogCaptureFixture) -> None:
    parts, producer, _ = parts_for(ScriptedLearner())
    with caplog.at_level(logging.WARNING, logger="ferret.trainer"):
        parts.stream.process(FakeMessage(TOPICS.samples, 1, 5, b"\x08\x96\x01not-a-sample"))  # type: ignore[arg-type]
    assert f"{TOPICS.samples}[1]@5" in caplog.text and "undecodable" in caplog.text  # logged once, with where
    assert parts.stream.ledger.resume_offsets() == {1: 5}
    producer.poll()
    assert [t for t, _ in producer.delivered] == [TOPICS.dlq]
    assert parts.stream.ledger.resume_offsets() == {1: 6}
    assert dict(parts.port.status().dead_lettered) == {"undecodable": 1}
    assert parts.port.status().items_valid == 0


def test_an_undelivered_prediction_holds_its_offset() -> None:
    parts, producer, _ = parts_for(ScriptedLearner(), FakeProducer(fail=KafkaError(KafkaError._MSG_TIMED_OUT)))
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, sample(0)))  # type: ignore[arg-type]
    producer.poll()
    assert parts.stream.ledger.resume_offsets() == {0: 0}  # a restart reads it again
    assert parts.port.status().predictions_published == 0


def test_a_learner_failure_stops_the_record_path_with_its_cause() -> None:
    parts, _, _ = parts_for(ScriptedLearner(error=ValueError("pipeline thread died")))
    with pytest.raises(RecordPathStopped, match=rf"arrive failed for {TOPICS.samples}\[0\]@4") as info:
        parts.stream.process(FakeMessage(TOPICS.samples, 0, 4, sample(0)))  # type: ignore[arg-type]
    assert isinstance(info.value.__cause__, ValueError)


def test_a_policy_rule_changes_what_happens_without_touching_the_path() -> None:
    policy = ErrorPolicy({Step.DECODE: Decision.SKIP})
    parts, producer, _ = parts_for(ScriptedLearner(), policy=policy)
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, b"junk"))  # type: ignore[arg-type]
    assert producer.queued == [] and parts.stream.ledger.resume_offsets() == {0: 1}  # given up, finished


def test_a_late_label_counts_toward_online_accuracy_once() -> None:
    parts, _, consumer = parts_for(ScriptedLearner())
    parts.stream.partitions.assigned = frozenset({0})
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, sample(0, label=None)))  # type: ignore[arg-type]
    label = messages_pb2.Label(sample_id="digits/0", label=3).SerializeToString()
    parts.stream.process(FakeMessage(TOPICS.labels, 0, 0, label))  # type: ignore[arg-type]
    status = parts.port.status()
    assert (status.labels_joined, status.labelled_predictions, status.online_accuracy) == (1, 1, 100.0)
    parts.stream.partitions.commit()
    assert (TOPICS.labels, 0, 1) in consumer.commits[-1]  # the label's offset, committed as it is


def test_policy_logs_where_and_decides_by_step(caplog: pytest.LogCaptureFixture) -> None:
    policy = ErrorPolicy()
    failure = RecordFailure(Step.DELIVER, "t.samples", 2, 9, "not_delivered", "timed out")
    with caplog.at_level(logging.ERROR, logger="ferret.trainer"):
        assert policy.decide(failure) is Decision.HOLD
    assert "t.samples[2]@9" in caplog.text and "not_delivered" in caplog.text
    assert {policy.rules[s] for s in (Step.ARRIVE, Step.PUBLISH)} == {Decision.STOP}


def test_shutdown_without_a_drain_in_budget_skips_the_snapshot_and_still_commits() -> None:
    learner = ScriptedLearner()
    learner.slow_drain = True
    parts, _, consumer = parts_for(learner)
    parts.stream.partitions.assigned = frozenset({0})
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 7, sample(0)))  # type: ignore[arg-type]
    parts.checkpoints.shutdown(parts.stream)
    assert learner.drain_timeout is not None and learner.drain_timeout <= 30.0  # the shared budget
    assert consumer.commits == [[(TOPICS.samples, 0, 8)]]  # flushed (delivered), then committed


class RecordingStore:
    def __init__(self) -> None:
        self.saved: list[object] = []

    def save(self, payload: object) -> int:
        self.saved.append(payload)
        return len(self.saved)

    def prune(self, keep: int) -> None: ...


def test_a_snapshot_that_cannot_drain_in_its_budget_saves_nothing_and_reports_unhealthy() -> None:
    learner = ScriptedLearner()
    learner.slow_drain = True
    health: list[bool] = []
    store = RecordingStore()
    parts = assemble(SETTINGS, learner, SampleDecoder((1, 8, 8), 10), store)  # type: ignore[arg-type]
    checkpoints = Checkpoints(
        store=store, learner=learner, plan=parts.checkpoints.plan, counters=parts.counters,  # type: ignore[arg-type]
        ledger=parts.checkpoints.ledger, lifecycle=parts.checkpoints.lifecycle, samples_topic=TOPICS.samples,
        instance_id="r0", keep=3, interval_s=0.0, on_health=health.append,
    )  # fmt: skip
    with pytest.raises(CheckpointTimeout, match="did not drain"):
        checkpoints.save({}, parts.stream)
    assert store.saved == [] and health == [False]


def test_loop_calls_run_on_the_loop_thread_and_fail_once_closed() -> None:
    calls = LoopCalls()
    ran_on: list[threading.Thread] = []
    results: list[int] = []
    bound = threading.Event()
    stop = threading.Event()

    def loop() -> None:
        calls.bind()
        bound.set()
        while not stop.is_set():
            calls.serve(lambda: _nullcontext())
        calls.close()

    thread = threading.Thread(target=loop)
    thread.start()
    bound.wait(5)
    results.append(calls.call(lambda: ran_on.append(threading.current_thread()) or 42))  # type: ignore[func-returns-value]
    stop.set()
    thread.join(5)
    assert results == [42] and ran_on == [thread]
    with pytest.raises(ServiceUnavailable):
        calls.call(lambda: 1)


def test_the_trainer_port_changes_nothing_once_the_callers_deadline_passed() -> None:
    """The control port hands each caller's deadline to the loop hand-over: a snapshot, a plan or a restore
    whose deadline has passed raises DeadlineExpired there, before the store, the learner or the plan is
    touched (tests/unit/test_control_deadlines.py holds the loop busy over real gRPC)."""
    store = RecordingStore()
    parts = assemble(SETTINGS, ScriptedLearner(), SampleDecoder((1, 8, 8), 10), store)  # type: ignore[arg-type]
    passed = CallDeadline(time.monotonic() - 1.0)
    plan, version = parts.port.current_plan()
    with pytest.raises(DeadlineExpired, match=r"^the snapshot was not applied"):
        parts.port.save_snapshot({}, deadline=passed)
    with pytest.raises(DeadlineExpired, match=rf"^plan v{version + 1} was not applied"):
        parts.port.apply_plan(sequential_plan("linear", 2, 1.0), version + 1, deadline=passed)
    with pytest.raises(DeadlineExpired, match=r"^the restore of snapshot v1 was not applied"):
        parts.port.restore_snapshot(1, deadline=passed)
    assert store.saved == [] and parts.port.current_plan() == (plan, version)
    assert parts.counters.to_snapshot().get("replans", 0) == 0


def test_counters_restore_snapshots_written_under_the_old_names() -> None:
    counters = StreamCounters()
    counters.restore({"items_valid": 5, "oacc_count": 4, "oacc_correct": 3, "dlq.non_finite": 2, "skipped.busy": 1})
    snapshot = counters.to_snapshot()
    assert snapshot["labelled_predictions"] == 4 and snapshot["correct_predictions"] == 3
    assert snapshot["dead_lettered.non_finite"] == 2 and snapshot["skipped.busy"] == 1
    assert counters.skipped[SkipReason.BUSY] == 1


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class DeferredLearner(ScriptedLearner):
    """Records when each item is submitted and when its outcome is awaited."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, int]] = []

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        self.events.append(("submit", item))

        def outcome() -> ArrivalOutcome:
            self.events.append(("outcome", item))
            return self.arrive(item, x, y, event_time_ms)

        return outcome


def test_a_batch_is_handed_to_the_learner_before_its_first_outcome_is_awaited() -> None:
    # a backlog's predictions run together: no record waits for the previous record's round trip
    learner = DeferredLearner()
    parts, producer, _ = parts_for(learner)
    batch = [FakeMessage(TOPICS.samples, 0, seq, sample(seq)) for seq in range(3)]
    parts.stream.process_batch(batch)  # type: ignore[arg-type]
    assert learner.events == [
        ("submit", 0),
        ("submit", 1),
        ("submit", 2),
        ("outcome", 0),
        ("outcome", 1),
        ("outcome", 2),
    ]
    producer.poll()
    assert [p.item for p in predictions(producer)] == [0, 1, 2]  # published in order
    assert parts.stream.ledger.resume_offsets() == {0: 3}  # nothing lost


def test_a_label_in_a_batch_settles_the_samples_before_it() -> None:
    learner = DeferredLearner()
    parts, producer, _ = parts_for(learner)
    unlabelled = encode_sample(np.zeros((1, 8, 8), np.uint8), stream="digits", sequence=0, label=None, event_time_ms=1)
    label = messages_pb2.Label(sample_id=unlabelled.id, label=3)
    batch = [
        FakeMessage(TOPICS.samples, 0, 0, unlabelled.SerializeToString()),
        FakeMessage(TOPICS.labels, 0, 0, label.SerializeToString()),
        FakeMessage(TOPICS.samples, 0, 1, sample(1)),
    ]
    parts.stream.process_batch(batch)  # type: ignore[arg-type]
    assert learner.events == [("submit", 0), ("outcome", 0), ("submit", 1), ("outcome", 1)]
    producer.poll()
    status = parts.port.status()
    assert status.predictions_published == 2 and status.labels_joined == 1  # the label found its prediction


class _Polls:
    """A consumer whose ``consume`` records its (num_messages, timeout) and returns what it holds."""

    def __init__(self, held: list[object]) -> None:
        self.held = held
        self.calls: list[tuple[int, float]] = []

    def consume(self, num_messages: int, timeout: float) -> list[object]:
        self.calls.append((num_messages, timeout))
        out, self.held = self.held[:num_messages], self.held[num_messages:]
        return out


def test_the_loop_polls_without_waiting_while_it_has_training_to_run() -> None:
    """``trainer.training_thread: loop``: with training pending the loop takes only what the client holds
    (timeout 0) and goes back to training; without, it waits up to POLL_S for the first record."""
    from services.trainer.stream import BATCH, POLL_S, RecordStream

    idle = _Polls([])
    assert RecordStream._next_batch(idle, wait=False) == [] and idle.calls == [(BATCH, 0)]  # type: ignore[arg-type]
    waiting = _Polls([])
    assert RecordStream._next_batch(waiting) == [] and waiting.calls == [(BATCH, 0), (1, POLL_S)]  # type: ignore[arg-type]
    held = _Polls(["a", "b"])
    assert RecordStream._next_batch(held, wait=False) == ["a", "b"] and held.calls == [(BATCH, 0)]  # type: ignore[arg-type]


class ComparingLearner(ScriptedLearner):
    """A scripted learner with the guard's late-label hook: records what the record path hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.late: list[tuple[int, int, bool]] = []

    def late_label(self, item: int, label: int, live_correct: bool) -> None:
        self.late.append((item, label, live_correct))


def test_a_late_label_reaches_the_guard_with_its_item() -> None:
    learner = ComparingLearner()
    parts, _, _ = parts_for(learner)
    parts.stream.partitions.assigned = frozenset({0})
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 0, sample(0, label=None)))  # type: ignore[arg-type]
    parts.stream.process(FakeMessage(TOPICS.samples, 0, 1, sample(1, label=None)))  # type: ignore[arg-type]
    label = messages_pb2.Label(sample_id="digits/1", label=5).SerializeToString()
    parts.stream.process(FakeMessage(TOPICS.labels, 0, 0, label))  # type: ignore[arg-type]
    assert learner.late == [(1, 5, False)]  # item 1 (the second sample), predicted 3 by the scripted learner
