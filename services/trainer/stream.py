"""The record's path through the trainer (DESIGN §1, §4): consume → decode → arrive → publish → store
offsets, one step per concern, as quix-streams' ``Application._process_message`` reads.

:meth:`RecordStream.process` is the whole path of one record. Every failure on it goes to the one
:class:`~services.trainer.failures.ErrorPolicy` (logged there with topic, partition and offset) and the
path carries out its decision in :meth:`RecordStream._fail`. An offset is finished when the record's
outcome is durable: its prediction delivered (the learner settles dispatch or skip before ``arrive``
returns), its dead letter delivered, or the record given up; the loop commits, per partition, the smallest
unfinished offset (:class:`~services.trainer.ledger.OffsetLedger`) every :data:`COMMIT_INTERVAL_S`, with
the outcome topics' positions that let the next owner of the partition flag every re-emitted outcome
(:mod:`.outcomes`). Outcomes are partition-aligned (sample partition p → outcome partition p mod n) and go
out through :class:`~services.trainer.publisher.Publisher` (too-large messages, a full queue, a rebuilt
producer whose resent outcomes are flagged duplicates where a first copy may be on the topic). Assignment,
revocation, commits and lag are :class:`~services.trainer.partitions.PartitionOwner`'s.

One loop thread (:meth:`RecordStream.run`) owns the Kafka clients and the learner's front door. Between
batches it serves the control plane's calls (re-plans, snapshots, restores: :mod:`.loop_calls`) and
periodic snapshots (:mod:`.checkpoints`) with consumption paused and counted; nothing else pauses it.
Where the learner trains on this thread (``trainer.training_thread``; the default for a 1 × 1 CPU plan), the
loop runs one training action after each batch and polls without waiting while training is pending.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from services.config import KafkaSettings
from services.control.trainer_port import TrainerState
from services.failpoints import failpoint
from services.kafka.fetch_wake import resume_and_wake
from services.kafka.rate_headers import Headers
from services.kafka.record_codec import (
    DEFAULT_MESSAGE_LIMIT,
    Rejection,
    RejectReason,
    SampleDecoder,
    ValidSample,
    dead_letter_record,
    now_ms,
)
from services.proto_gen.ferret.v1 import messages_pb2
from services.trainer.checkpoints import Checkpoints
from services.trainer.counters import StreamCounters
from services.trainer.failures import TOO_LARGE, Decision, ErrorPolicy, RecordFailure, RecordPathStopped, Step
from services.trainer.guard.events import HEADERS as EVENT_HEADERS
from services.trainer.guard.events import event_message
from services.trainer.labels import LateLabelJoin
from services.trainer.learner import ArrivalOutcome, Learner
from services.trainer.ledger import OffsetLedger
from services.trainer.live_methods import DELIVERY_ITEMS
from services.trainer.loop_calls import LoopCalls
from services.trainer.partitions import COMMIT_INTERVAL_S, PartitionOwner
from services.trainer.path_trace import PathTrace, wall_ms
from services.trainer.predictions import HEADERS as PREDICTION_HEADERS
from services.trainer.predictions import prediction_message
from services.trainer.publisher import MessageTooLarge, ProducerLike, Publisher, Reissue, too_large
from services.trainer.state import Lifecycle, PlanInForce

log = logging.getLogger("ferret.trainer")

BATCH = DELIVERY_ITEMS  # records per consume() call (the admission queue holds one such delivery)
POLL_S = 0.05
BLAMED_ITEMS = 4096  # recent items whose record a learner failure can be blamed on
DLQ_DUPLICATE = "ferret.dlq.duplicate"  # "true" on a dead letter an earlier run or owner already wrote
# fetch.wait.max.ms 10 (librdkafka's default is 500): measured p99 of the broker hop 20 ms vs 258 ms and of
# arrival → prediction 192 vs 306 ms (benchmarks/service/results/latency.md). Commits are the loop's own;
# end-of-partition events tell the lag when the consumer is caught up (lag.py).
CONSUMER_DEFAULTS = {"enable.auto.commit": False, "enable.partition.eof": True, "fetch.wait.max.ms": 10}


def _ignore(*_: object) -> None:
    return None


@dataclass(frozen=True)
class StreamHooks:
    """What others learn from the record path, passed in at construction: the sample partitions once
    assigned (readiness, the measured arrival rate), each valid arrival's (event time ms, partition, the
    record's headers: a declared rate) and its sample and label (the live staleness calibration's head),
    and each delivered prediction's latency in ms (the metrics histogram), and a call after each consumer
    batch (the model stream's publisher)."""

    on_assigned: Callable[[frozenset[int]], None] = _ignore
    on_arrival: Callable[[int, int, Headers | None], None] = _ignore
    on_sample: Callable[[torch.Tensor, int | None], None] = _ignore
    on_latency: Callable[[float], None] = _ignore
    on_batch: Callable[[], None] = lambda: None  # after each consumer batch, on the loop (the model stream's tick)


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


@dataclass(frozen=True, slots=True)
class _Pending:
    """A sample handed to the learner whose outcome the record path has not published yet."""

    record: Record
    sample: ValidSample
    item: int
    outcome: Callable[[], ArrivalOutcome]  # waits for the prediction and decision
    stamps: dict[str, float | int | str | None] | None  # the path trace's (None: tracing off)


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
        self._consumer: Consumer | None = None
        self._publisher: Publisher | None = None
        self.partitions = PartitionOwner(kafka, ledger, flush=self.flush, on_assigned=hooks.on_assigned)
        self.lag = self.partitions.lag
        self._blame: OrderedDict[int, tuple[int, int]] = OrderedDict()  # item -> (partition, offset)
        self.max_message_bytes = int(kafka.properties.get("message.max.bytes", DEFAULT_MESSAGE_LIMIT))
        self.trace = PathTrace.from_env()  # off unless FERRET_TRACE_RECORD_PATH is set (path_trace.py)
        self._stamps: dict[str, float | int | str | None] = {}

    # -- the loop ------------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then drain, snapshot and commit (the SIGTERM path)."""
        self.calls.bind()
        consumer, publisher = self.connect()
        consumer.subscribe(
            [self.topics.samples, self.topics.labels],
            on_assign=self.partitions.on_assign,
            on_revoke=self.partitions.on_revoke,
            on_lost=self.partitions.on_lost,
        )
        self.lifecycle.state = TrainerState.RUNNING
        committed = time.monotonic()
        try:
            trace = self.trace
            while not stop.is_set():
                began = wall_ms() if trace is not None else 0.0
                self.calls.serve(self.paused)  # re-plans, snapshots, restores asked by the control plane
                if trace is not None and wall_ms() - began > 1.0:
                    trace.pause(began, wall_ms(), "control call")
                training = self.learner.pending_training()  # the learner trains on this thread: poll, never wait
                batch = self._next_batch(consumer, wait=not training)
                if trace is not None:
                    self._stamps = {"fetched": round(wall_ms(), 3), "batch": len(batch)}
                self.process_batch(batch)
                self.publish_events()  # the guard's rollbacks, promotions and drifts, if any
                if training:
                    self.learner.train_step()  # one action, then the records that came meanwhile first
                self.hooks.on_batch()
                publisher.poll(0)  # delivery callbacks: they finish offsets
                if time.monotonic() - committed >= COMMIT_INTERVAL_S:
                    self.partitions.commit()
                    self.partitions.measure_lag()
                    committed = time.monotonic()
                if self.checkpoints.due():
                    began = wall_ms()
                    with self.paused():
                        self.checkpoints.save_periodic(self)
                    if trace is not None:
                        trace.pause(began, wall_ms(), "periodic snapshot")
        finally:
            if self.trace is not None:
                self.trace.close()
            self.lifecycle.state = TrainerState.STOPPING
            try:
                self.checkpoints.shutdown(self)
            finally:
                self.calls.close()
                consumer.close()
                try:
                    self.learner.close()
                except Exception as exc:  # a failed learner re-raises its failure: already reported
                    log.debug("closing the learner: %s", exc)

    @staticmethod
    def _next_batch(consumer: Consumer, *, wait: bool = True) -> list[Message]:
        """What the client holds now (up to :data:`BATCH`), else (``wait``) the first record within
        :data:`POLL_S`: a record is processed as soon as it is there (``consume(n, timeout)`` alone waits
        for n records or the whole timeout, adding up to 50 ms to every item of a slow stream). Without
        ``wait`` (the learner has training to run on this thread) only what the client holds."""
        held = consumer.consume(num_messages=BATCH, timeout=0)
        if held or not wait:
            return held
        return consumer.consume(num_messages=1, timeout=POLL_S)

    def connect(
        self,
        consumer: Consumer | None = None,
        producer: ProducerLike | None = None,
        *,
        producer_factory: Callable[[Callable[[KafkaError], None]], ProducerLike] | None = None,
    ) -> tuple[Consumer, Publisher]:
        """Create the Kafka clients (lazily, on the loop thread; tests may pass their own). The producer
        is made by ``producer_factory`` (given librdkafka's ``error_cb``), again after a fatal error."""

        def make(error_cb: Callable[[KafkaError], None]) -> ProducerLike:
            if producer_factory is not None:
                return producer_factory(error_cb)
            if producer is not None:
                return producer
            return cast(ProducerLike, Producer({**self.kafka.producer_config(), "error_cb": error_cb}))

        self._consumer = consumer or Consumer({**CONSUMER_DEFAULTS, **self.kafka.consumer_config()})
        self.partitions.consumer = self._consumer
        self._publisher = Publisher(make)
        return self._consumer, self._publisher

    # -- one record's path ----------------------------------------------------------------------------
    def process(self, message: Message) -> None:
        """One record's path (:meth:`process_batch` of one)."""
        self.process_batch([message])

    def process_batch(self, messages: Sequence[Message]) -> None:
        """Consume → decode → arrive → publish for each record, in order; the offset is finished when the
        outcome is durable. The samples of a batch are all handed to the learner (steps 1–3) before the
        first one's outcome is awaited and published (step 4), so a backlog's predictions run together
        (the learner predicts what queued up in one forward pass) instead of each waiting for the
        previous record's round trip. A label or a broker event first settles the samples before it."""
        pending: list[_Pending] = []
        for position, message in enumerate(messages):
            record = Record.of(message)
            if message.error() is None and record.topic != self.topics.labels:
                staged = self._stage(record, position)
                if staged is not None:
                    pending.append(staged)
                continue
            self._settle(pending)
            pending = []
            error = message.error()
            if error is not None:
                self._broker_error(record, error)
            elif record.topic == self.topics.labels:
                self._join_label(record)
        self._settle(pending)

    def _stage(self, record: Record, position: int) -> _Pending | None:
        self._receive(record)  # 1. counted; its offset is pending until its outcome is durable
        poisoned = self.policy.poisoned(*_where(record))  # it made the trainer stop too often: dead letter
        if poisoned is not None:
            self._fail(poisoned, record)
            return None
        sample = self._decode(record)  # 2. a valid sample, else the error policy (dead letter)
        if sample is None:
            return None
        return self._arrive(record, sample, position)  # 3. handed to the learner: predicted, then dispatched

    def _settle(self, pending: Sequence[_Pending]) -> None:
        for staged in pending:
            outcome = self._outcome(staged)  # 3. its prediction and decision
            if outcome is None:
                continue
            failpoint("trainer.mid-record")  # trained, its outcome not yet published
            self._publish(staged.record, staged.sample, staged.item, outcome, staged.stamps)  # 4. produced

    def _receive(self, record: Record) -> None:
        self.counters.add("items_received")
        self.ledger.add(record.partition, record.offset)
        self.partitions.lag.consumed(record.partition, record.offset, None)

    def _decode(self, record: Record) -> ValidSample | None:
        decoded = self.decoder.decode(record.message.value())
        if isinstance(decoded, Rejection):
            self._fail(RecordFailure(Step.DECODE, *_where(record), decoded.reason, decoded.detail), record)
            return None
        return decoded

    def _arrive(self, record: Record, sample: ValidSample, position: int = 0) -> _Pending | None:
        item = self.counters.next_item(sample.event_time_ms)
        self.hooks.on_arrival(sample.event_time_ms, record.partition, record.message.headers())
        self.hooks.on_sample(sample.x, sample.label)
        self.partitions.lag.consumed(record.partition, record.offset, sample.event_time_ms)
        self._blame[item] = (record.partition, record.offset)
        if len(self._blame) > BLAMED_ITEMS:
            self._blame.popitem(last=False)
        stamps = None if self.trace is None else {**self._stamps, "position": position, "arrive": round(wall_ms(), 3)}
        try:
            outcome = self.learner.submit(item, sample.x, sample.label, sample.event_time_ms)
        except Exception as exc:
            self._learner_failed(exc, record, item)
            return None
        return _Pending(record, sample, item, outcome, stamps)

    def _outcome(self, staged: _Pending) -> ArrivalOutcome | None:
        try:
            outcome = staged.outcome()
        except Exception as exc:
            self._learner_failed(exc, staged.record, staged.item)
            return None
        if staged.stamps is not None:
            staged.stamps["predicted"] = round(wall_ms(), 3)
        return outcome

    def _learner_failed(self, exc: Exception, record: Record, item: int) -> None:
        # blame the record whose item the failing pipeline action ran (LearnerFailed.item), else this one
        partition, offset = self._blame.get(getattr(exc, "item", item), (record.partition, record.offset))
        reason = type(exc.__cause__ or exc).__name__
        self._fail(RecordFailure(Step.ARRIVE, record.topic, partition, offset, reason, str(exc), exc), record)

    def _publish(
        self,
        record: Record,
        sample: ValidSample,
        item: int,
        outcome: ArrivalOutcome,
        stamps: dict[str, float | int | str | None] | None = None,
    ) -> None:
        online_accuracy = self.counters.count_arrival(outcome, sample.label)
        if sample.label is None:
            self.labels.remember(sample.sample_id, outcome.predicted_class, item)
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

        def flagged() -> Reissue:  # resent by a rebuilt producer while a first copy may be on the topic
            message.duplicate = True
            return Reissue(message.SerializeToString(), PREDICTION_HEADERS,
                           lambda err, msg: self._delivered(err, msg, record, True, latency))  # fmt: skip

        assert self._publisher is not None
        try:
            self._publisher.send(
                self.topics.predictions,
                message.SerializeToString(),
                key=sample.sample_id.encode(),
                headers=PREDICTION_HEADERS,
                partition=self.partitions.outcome_partition(self.topics.predictions, record.partition),
                on_delivery=lambda err, msg: self._delivered(err, msg, record, duplicate, latency),
                flagged=None if duplicate else flagged,
            )
        except MessageTooLarge as exc:
            self._fail(RecordFailure(Step.PUBLISH, *_where(record), TOO_LARGE, str(exc), exc), record)
            return
        except (BufferError, KafkaException) as exc:
            self._fail(RecordFailure(Step.PUBLISH, *_where(record), type(exc).__name__, str(exc), exc), record)
            return
        self.ledger.mark_predicted(record.partition, record.offset)
        if self.trace is not None and stamps is not None:
            skipped = None if outcome.skipped is None else outcome.skipped.value
            view = getattr(self.learner, "trace_view", None)  # the admission's view, where the learner has one
            self.trace.record(
                {
                    **stamps,
                    "event": sample.event_time_ms,
                    "published": round(wall_ms(), 3),
                    "skipped": skipped,
                    "cpu": round(time.thread_time() * 1000.0, 3),
                    **({} if view is None else view()),
                }
            )

    def _delivered(
        self, err: KafkaError | None, msg: Message | None, record: Record, duplicate: bool, latency: float
    ) -> None:
        if err is not None:
            reason = TOO_LARGE if too_large(err) else "not_delivered"
            self._fail(RecordFailure(Step.DELIVER, *_where(record), reason, err.str()), record)
            return
        self.counters.count_delivery(duplicate, latency)
        self.hooks.on_latency(latency)
        self.partitions.outcome_delivered(self.topics.predictions, record.partition, record.offset, msg)
        self.ledger.finish(record.partition, record.offset)

    def publish_events(self) -> None:
        """The learner's events (a guarded learner's ``take_events``: rollbacks, promotions, drifts) to
        ``<prefix>.events``, each with the stream position of its deciding item. At most once: an event
        the broker refuses is logged (its counter and log line already tell it), never retried."""
        take = getattr(self.learner, "take_events", None)
        if take is None or self._publisher is None:
            return
        for event in take():
            partition, offset = self._blame.get(event.item, (-1, -1))
            message = event_message(event, instance_id=self.instance_id, partition=partition, offset=offset)
            try:
                self._publisher.send(
                    self.topics.events,
                    message.SerializeToString(),
                    key=self.instance_id.encode(),
                    headers=EVENT_HEADERS,
                    partition=0,
                    on_delivery=_event_delivered,
                )
            except (MessageTooLarge, BufferError, KafkaException) as exc:
                log.warning("the %s event of item %d was not published to %s: %s", event.kind, event.item,
                            self.topics.events, exc)  # fmt: skip

    def _join_label(self, record: Record) -> None:
        label = messages_pb2.Label()
        try:
            label.ParseFromString(record.message.value() or b"")
        except Exception as exc:  # protobuf's DecodeError
            self._fail(RecordFailure(Step.LABEL, *_where(record), "undecodable", str(exc), exc), record)
            return
        joined = self.labels.join(label.sample_id, int(label.label))  # the loop thread's own state
        if joined is not None:
            self.counters.count_late_label(joined.correct)
            compare = getattr(self.learner, "late_label", None)  # the guard's (services/trainer/guard/learner.py)
            if compare is not None:
                compare(joined.item, int(label.label), joined.correct)
        self._finish(record)

    def _broker_error(self, record: Record, error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:  # not a failure: caught up with the partition, for now
            if record.topic == self.topics.samples:
                self.partitions.lag.end_of_partition(record.partition, record.offset)
            return
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
        producer's message limit, :func:`services.kafka.record_codec.dead_letter_record`); finished on delivery. One an
        earlier run or owner already wrote carries ``ferret.dlq.duplicate: true``, and so does its copy that a
        rebuilt producer resends while a first copy may be on the topic."""
        self.counters.count_dead_letter(failure.reason)
        rejection = Rejection(cast(RejectReason, failure.reason), failure.detail)
        letter = dead_letter_record(record.message, rejection, max_bytes=self.max_message_bytes - 256)
        headers = letter.headers
        duplicate = self.ledger.is_duplicate(record.partition, record.offset)
        if duplicate:
            headers = [*headers, (DLQ_DUPLICATE, b"true")]

        def delivered(err: KafkaError | None, msg: Message | None) -> None:
            if err is None:
                self.partitions.outcome_delivered(self.topics.dlq, record.partition, record.offset, msg)
                self._finish(record)
            else:
                reason = TOO_LARGE if too_large(err) else "not_delivered"
                self._fail(RecordFailure(Step.DEAD_LETTER, *_where(record), reason, err.str()), record)

        def flagged() -> Reissue:  # resent by a rebuilt producer while a first copy may be on the topic
            return Reissue(letter.value, [*headers, (DLQ_DUPLICATE, b"true")], delivered)

        assert self._publisher is not None
        try:
            self._publisher.send(
                self.topics.dlq,
                letter.value,
                key=letter.key,
                headers=headers,
                partition=self.partitions.outcome_partition(self.topics.dlq, record.partition),
                on_delivery=delivered,
                flagged=None if duplicate else flagged,
            )
        except MessageTooLarge as exc:
            self._fail(RecordFailure(Step.DEAD_LETTER, *_where(record), TOO_LARGE, str(exc), exc), record)

    def _finish(self, record: Record) -> None:
        if record.topic == self.topics.samples:
            self.ledger.finish(record.partition, record.offset)
        else:  # a label: its offset is committed as it is
            self.partitions.label_done(record.partition, record.offset)

    # -- assignment, pauses, offsets (the checkpoints' StreamEnds) -------------------------------------
    def resume_from(self, offsets: Mapping[int, int]) -> None:
        """Read each sample partition from ``offsets`` (a restored snapshot's), now or at its assignment."""
        self.partitions.resume_from(offsets)

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
            if partitions and self._consumer is not None:  # woken: else it fetches after an idle wait of ~1 s
                resume_and_wake(self._consumer, partitions)

    # -- the checkpoints' StreamEnds ------------------------------------------------------------------------
    def store_offsets(self) -> None:
        """Committing is the loop's own (:meth:`commit_progress`); nothing is stored apart."""

    def flush(self, timeout_s: float) -> int:
        return 0 if self._publisher is None else self._publisher.flush(timeout_s)

    def commit(self) -> None:
        """The final commit (shutdown): synchronous."""
        self.partitions.commit(sync=True)


def _event_delivered(err: KafkaError | None, _msg: Message | None) -> None:
    if err is not None:
        log.warning("a model event was not delivered: %s", err.str())


def _where(record: Record) -> tuple[str, int, int]:
    return record.topic, record.partition, record.offset
