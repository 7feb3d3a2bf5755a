"""The record's path through the trainer (DESIGN §1, §4): consume → decode → arrive → publish → store
offsets, one step per concern, as quix-streams' ``Application._process_message`` reads.

:meth:`RecordStream.process` is the whole path of one record. Every failure on it goes to the one
:class:`~services.trainer.failures.ErrorPolicy` (logged there with topic, partition and offset) and the
path carries out its decision in :meth:`RecordStream._fail`. An offset is finished when the record's
outcome is durable: its prediction delivered (the learner settles dispatch or skip before ``arrive``
returns), its dead letter delivered, or the record given up; the loop stores, per partition, the smallest
unfinished offset (:class:`~services.trainer.ledger.OffsetLedger`) every :data:`OFFSET_STORE_INTERVAL_S`.

One loop thread (:meth:`RecordStream.run`) owns the Kafka clients and the learner's front door. Between
batches it serves the control plane's calls (re-plans, snapshots, restores: :mod:`.loop_calls`) and
periodic snapshots (:mod:`.checkpoints`) with consumption paused and counted; nothing else pauses it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from services.codec import Rejection, RejectReason, SampleDecoder, ValidSample, dead_letter_record, now_ms
from services.config import KafkaSettings
from services.control.trainer_port import TrainerState
from services.proto_gen.ferret.v1 import messages_pb2
from services.stream_rate import Headers
from services.trainer.checkpoints import Checkpoints
from services.trainer.counters import StreamCounters
from services.trainer.failures import Decision, ErrorPolicy, RecordFailure, RecordPathStopped, Step
from services.trainer.labels import LateLabelJoin
from services.trainer.learner import ArrivalOutcome, Learner
from services.trainer.ledger import OffsetLedger
from services.trainer.loop_calls import LoopCalls
from services.trainer.methods import DELIVERY_ITEMS
from services.trainer.predictions import HEADERS as PREDICTION_HEADERS
from services.trainer.predictions import prediction_message
from services.trainer.state import Lifecycle, PlanInForce

log = logging.getLogger("ferret.trainer")

OFFSET_STORE_INTERVAL_S = 0.2
BATCH = DELIVERY_ITEMS  # records per consume() call (the admission queue holds one such delivery)
POLL_S = 0.05
# Committed offsets bound the duplicates a crash can leave unflagged: commit stored ones every second.
# fetch.wait.max.ms 10 (librdkafka's default is 500): measured p99 of the broker hop 20 ms vs 258 ms and of
# arrival → prediction 192 vs 306 ms (benchmarks/service/results/latency.md).
CONSUMER_DEFAULTS = {"auto.commit.interval.ms": 1000, "fetch.wait.max.ms": 10}


def _ignore(*_: object) -> None:
    return None


@dataclass(frozen=True)
class StreamHooks:
    """What others learn from the record path, passed in at construction: the sample partitions once
    assigned (readiness, the measured arrival rate), each valid arrival's (event time ms, partition, the
    record's headers: a declared rate), and each delivered prediction's latency in ms (the metrics
    histogram)."""

    on_assigned: Callable[[frozenset[int]], None] = _ignore
    on_arrival: Callable[[int, int, Headers | None], None] = _ignore
    on_latency: Callable[[float], None] = _ignore


@dataclass(frozen=True, slots=True)
class Record:
    """A consumed record and where it came from."""

    message: Message
    topic: str
    partition: int
    offset: int

    @classmethod
    def of(cls, message: Message) -> Record:
        return cls(message, message.topic() or "", int(message.partition() or 0), int(message.offset() or 0))


class RecordStream:
    """The loop and the record path (module docstring). Implements the checkpoints' ``StreamEnds``."""

    def __init__(
        self,
        *,
        kafka: KafkaSettings,
        learner: Learner,
        decoder: SampleDecoder,
        counters: StreamCounters,
        ledger: OffsetLedger,
        labels: LateLabelJoin,
        plan: PlanInForce,
        lifecycle: Lifecycle,
        checkpoints: Checkpoints,
        calls: LoopCalls,
        policy: ErrorPolicy,
        hooks: StreamHooks,
    ) -> None:
        self.kafka = kafka
        self.topics = kafka.topics
        self.instance_id = kafka.resolved_instance_id()
        self.learner = learner
        self.decoder = decoder
        self.counters = counters
        self.ledger = ledger
        self.labels = labels
        self.plan = plan
        self.lifecycle = lifecycle
        self.checkpoints = checkpoints
        self.calls = calls
        self.policy = policy
        self.hooks = hooks
        self.assigned_partitions: frozenset[int] = frozenset()  # sample partitions this replica owns
        self._resume_at: dict[int, int] = {}  # from a restored snapshot: where each partition starts
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then drain, snapshot and commit (the SIGTERM path)."""
        self.calls.bind()
        consumer, producer = self.connect()
        consumer.subscribe([self.topics.samples, self.topics.labels], on_assign=self._on_assign)
        self.lifecycle.state = TrainerState.RUNNING
        stored = time.monotonic()
        try:
            while not stop.is_set():
                self.calls.serve(self.paused)  # re-plans, snapshots, restores asked by the control plane
                for message in self._next_batch(consumer):
                    self.process(message)
                producer.poll(0)  # delivery callbacks: they finish offsets
                if time.monotonic() - stored >= OFFSET_STORE_INTERVAL_S:
                    self.store_offsets()
                    stored = time.monotonic()
                if self.checkpoints.due():
                    with self.paused():
                        self.checkpoints.save_periodic(self)
        finally:
            self.lifecycle.state = TrainerState.STOPPING
            try:
                self.checkpoints.shutdown(self)
            finally:
                self.calls.close()
                consumer.close()
                self.learner.close()

    @staticmethod
    def _next_batch(consumer: Consumer) -> list[Message]:
        """What the client holds now (up to :data:`BATCH`), else the first record within :data:`POLL_S`:
        a record is processed as soon as it is there (``consume(n, timeout)`` alone waits for n records
        or the whole timeout, adding up to 50 ms to every item of a slow stream)."""
        return consumer.consume(num_messages=BATCH, timeout=0) or consumer.consume(num_messages=1, timeout=POLL_S)

    def connect(self, consumer: Consumer | None = None, producer: Producer | None = None) -> tuple[Consumer, Producer]:
        """Create the Kafka clients (lazily, on the loop thread; tests may pass their own)."""
        self._consumer = consumer or Consumer({**CONSUMER_DEFAULTS, **self.kafka.consumer_config()})
        self._producer = producer or Producer(self.kafka.producer_config())
        return self._consumer, self._producer

    # -- one record's path ----------------------------------------------------------------------------
    def process(self, message: Message) -> None:
        """Consume → decode → arrive → publish; the offset is finished when the outcome is durable."""
        record = Record.of(message)
        error = message.error()
        if error is not None:
            return self._broker_error(record, error)
        if record.topic == self.topics.labels:
            return self._join_label(record)
        self._receive(record)  # 1. counted; its offset is pending until its outcome is durable
        sample = self._decode(record)  # 2. a valid sample, else the error policy (dead letter)
        if sample is None:
            return None
        arrived = self._arrive(record, sample)  # 3. predicted, then dispatched or skipped
        if arrived is None:
            return None
        return self._publish(record, sample, *arrived)  # 4. produced; its delivery finishes the offset

    def _receive(self, record: Record) -> None:
        self.counters.add("items_received")
        self.ledger.add(record.partition, record.offset)

    def _decode(self, record: Record) -> ValidSample | None:
        decoded = self.decoder.decode(record.message.value())
        if isinstance(decoded, Rejection):
            self._fail(RecordFailure(Step.DECODE, *_where(record), decoded.reason, decoded.detail), record)
            return None
        return decoded

    def _arrive(self, record: Record, sample: ValidSample) -> tuple[int, ArrivalOutcome] | None:
        item = self.counters.next_item(sample.event_time_ms)
        self.hooks.on_arrival(sample.event_time_ms, record.partition, record.message.headers())
        try:
            return item, self.learner.arrive(item, sample.x, sample.label, sample.event_time_ms)
        except Exception as exc:
            self._fail(RecordFailure(Step.ARRIVE, *_where(record), type(exc).__name__, str(exc), exc), record)
            return None

    def _publish(self, record: Record, sample: ValidSample, item: int, outcome: ArrivalOutcome) -> None:
        online_accuracy = self.counters.count_arrival(outcome, sample.label)
        if sample.label is None:
            self.labels.remember(sample.sample_id, outcome.predicted_class)
        duplicate = self.ledger.is_duplicate(record.partition, record.offset)
        latency = max(0.0, float(now_ms() - sample.event_time_ms))
        message = prediction_message(
            sample,
            outcome,
            item=item,
            online_accuracy=online_accuracy,
            duplicate=duplicate,
            plan_version=self.plan.version,
            instance_id=self.instance_id,
            partition=record.partition,
            offset=record.offset,
            latency_ms=latency,
            time_ms=now_ms(),
        )
        assert self._producer is not None
        try:
            self._producer.produce(
                self.topics.predictions,
                message.SerializeToString(),
                key=sample.sample_id.encode(),
                headers=PREDICTION_HEADERS,
                on_delivery=lambda err, _msg: self._delivered(err, record, duplicate, latency),
            )
        except (BufferError, KafkaException) as exc:
            self._fail(RecordFailure(Step.PUBLISH, *_where(record), type(exc).__name__, str(exc), exc), record)
            return
        self.ledger.mark_predicted(record.partition, record.offset)

    def _delivered(self, err: KafkaError | None, record: Record, duplicate: bool, latency: float) -> None:
        if err is not None:
            self._fail(RecordFailure(Step.DELIVER, *_where(record), "not_delivered", str(err)), record)
            return
        self.counters.count_delivery(duplicate, latency)
        self.hooks.on_latency(latency)
        self.ledger.finish(record.partition, record.offset)

    def _join_label(self, record: Record) -> None:
        label = messages_pb2.Label()
        try:
            label.ParseFromString(record.message.value() or b"")
        except Exception as exc:  # protobuf's DecodeError
            self._fail(RecordFailure(Step.LABEL, *_where(record), "undecodable", str(exc), exc), record)
            return
        correct = self.labels.join(label.sample_id, int(label.label))  # the loop thread's own state
        if correct is not None:
            self.counters.count_late_label(correct)
        self._finish(record)

    def _broker_error(self, record: Record, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return  # not a failure: the end of a partition for now
        self._fail(RecordFailure(Step.CONSUME, *_where(record), error.name(), error.str()))

    # -- the error policy's decisions -----------------------------------------------------------------
    def _fail(self, failure: RecordFailure, record: Record | None = None) -> None:
        """Ask the error policy and carry out its decision (:mod:`.failures`)."""
        decision = self.policy.decide(failure)
        if decision is Decision.STOP:
            raise RecordPathStopped(failure) from failure.error
        if record is None or decision is Decision.HOLD:
            return
        if decision is Decision.DEAD_LETTER:
            self._dead_letter(record, failure)
        else:
            self._finish(record)

    def _dead_letter(self, record: Record, failure: RecordFailure) -> None:
        """The original record to ``<prefix>.samples.dlq`` with the failure's reason (bounded to the
        producer's message limit, :func:`services.codec.dead_letter_record`); finished on delivery."""
        self.counters.count_dead_letter(failure.reason)
        letter = dead_letter_record(record.message, Rejection(cast(RejectReason, failure.reason), failure.detail))

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self._finish(record)
            else:
                self._fail(RecordFailure(Step.DEAD_LETTER, *_where(record), "not_delivered", str(err)), record)

        assert self._producer is not None
        self._producer.produce(
            self.topics.dlq, letter.value, key=letter.key, headers=letter.headers, on_delivery=delivered
        )

    def _finish(self, record: Record) -> None:
        if record.topic == self.topics.samples:
            self.ledger.finish(record.partition, record.offset)
        elif self._consumer is not None:  # a label: its offset is stored as it is
            self._consumer.store_offsets(message=record.message)

    # -- assignment, pauses, offsets (the checkpoints' StreamEnds) -------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start from the snapshot's offsets (else the group's committed ones). Everything below the
        committed offset was predicted before (offsets are stored only after delivery), so re-reading it
        re-emits predictions flagged ``duplicate``."""
        samples = [tp for tp in partitions if tp.topic == self.topics.samples]
        self.assigned_partitions = frozenset(tp.partition for tp in samples)
        try:
            committed = consumer.committed(samples, timeout=10) if samples else []
        except KafkaException as exc:
            log.warning("reading committed offsets failed: %s", exc)
            committed = []
        log.debug("assigned %s; committed %s; snapshot offsets %s", partitions, committed, self._resume_at)
        for tp in committed:
            if tp.offset >= 0:
                self.ledger.known_predicted(tp.partition, tp.offset)
        for tp in samples:
            if tp.partition in self._resume_at:
                tp.offset = self._resume_at[tp.partition]
        consumer.assign(partitions)
        self.hooks.on_assigned(self.assigned_partitions)  # readiness: only now can the trainer take the stream

    def resume_from(self, offsets: Mapping[int, int]) -> None:
        """Read each sample partition from ``offsets`` (a restored snapshot's): at the next assignment, and
        now for partitions already assigned (on the loop thread)."""
        self._resume_at = dict(offsets)
        if self._consumer is None:
            return
        for partition, offset in self._resume_at.items():
            try:
                self._consumer.seek(TopicPartition(self.topics.samples, partition, offset))
            except KafkaException as exc:  # not assigned to this replica (any more)
                log.warning("seek %s[%s] to %s failed: %s", self.topics.samples, partition, offset, exc)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Consumption of the assigned partitions paused (counted) for a re-plan or a snapshot."""
        partitions = self._consumer.assignment() if self._consumer is not None else []
        if partitions and self._consumer is not None:
            self._consumer.pause(partitions)
        self.counters.add("pauses")
        try:
            yield
        finally:
            if partitions and self._consumer is not None:
                self._consumer.resume(partitions)

    def store_offsets(self) -> None:
        """Store, per sample partition, the smallest unfinished offset (auto-commit commits them)."""
        if self._consumer is None:
            return
        offsets = [TopicPartition(self.topics.samples, p, o) for p, o in self.ledger.resume_offsets().items()]
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:  # e.g. a partition revoked meanwhile
                log.warning("storing offsets failed: %s", exc)

    def flush(self, timeout_s: float) -> int:
        return 0 if self._producer is None else int(self._producer.flush(timeout_s))

    def commit(self) -> None:
        if self._consumer is None:
            return
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # _NO_OFFSET: auto-commit already committed all
                log.error("final commit failed: %s", exc)


def _where(record: Record) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset
