"""The trainer: a consumer-group member that predicts every item on arrival and trains the planned
pipeline, publishing one Prediction per valid input item (DESIGN §1, §4 "The trainer's stream semantics").

One loop thread owns the Kafka clients and the learner's front door. The control plane (gRPC threads)
asks for re-plans, snapshots and restores through :meth:`Trainer._on_loop`, which runs them on the loop
thread between batches, with consumption paused and counted; nothing else pauses the stream.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from ferret_core.plan import Plan
from services.codec import Rejection, SampleDecoder, dead_letter, now_ms
from services.config import Settings
from services.control.errors import SnapshotNotFound
from services.control.trainer_port import (
    AppliedPlan,
    PartitionOffset,
    SnapshotInfo,
    TrainerState,
    TrainerStatus,
)
from services.proto_gen.ferret.v1 import messages_pb2
from services.snapshots import SnapshotManifest, SnapshotNotFoundError, SnapshotPayload, SnapshotStore
from services.trainer.counters import StreamCounters
from services.trainer.labels import LateLabelJoin
from services.trainer.learner import Learner, Verdict
from services.trainer.ledger import OffsetLedger

log = logging.getLogger("ferret.trainer")
T = TypeVar("T")

DECISIONS = {
    None: messages_pb2.TRAINING_DECISION_DISPATCHED,
    "busy": messages_pb2.TRAINING_DECISION_SKIPPED_BUSY,
    "worker_removed": messages_pb2.TRAINING_DECISION_SKIPPED_WORKER_REMOVED,
    "no_label": messages_pb2.TRAINING_DECISION_SKIPPED_NO_LABEL,
}
OFFSET_STORE_INTERVAL_S = 0.2


@dataclass
class _Outcome:
    """An item's offset is finished once its prediction is delivered and its training is reflected."""

    partition: int
    offset: int
    remaining: int = 2


class Trainer:
    """Implements :class:`services.control.trainer_port.TrainerPort`."""

    def __init__(
        self,
        settings: Settings,
        learner: Learner,
        plan: Plan,
        decoder: SampleDecoder,
        store: SnapshotStore | None,
        *,
        on_snapshot_health: Callable[[bool], None] | None = None,
        snapshot_on_stop: bool = True,
        on_assigned: Callable[[], None] | None = None,
        on_arrival: Callable[[int, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topics = settings.kafka.topics
        self.instance_id = settings.kafka.resolved_instance_id()
        self.learner = learner
        self.decoder = decoder
        self.store = store
        self.snapshot_on_stop = snapshot_on_stop
        self._on_assigned = on_assigned
        self.assigned_partitions: frozenset[int] = frozenset()  # sample partitions this replica owns
        self._on_arrival = on_arrival  # (event time ms, partition) of each valid item: `measured` interval
        self._snapshot_health = on_snapshot_health or (lambda ok: None)
        self._plan = plan
        self._plan_version = 1
        self._state = TrainerState.STARTING
        self.counters = StreamCounters()
        self.ledger = OffsetLedger()
        self.labels = LateLabelJoin(settings.trainer.label_window)
        self._seek_to: dict[int, int] = {}
        self._requests: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._loop_thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self._outcome_lock = threading.Lock()
        self._last_snapshot_version = 0
        self._last_snapshot_time = time.monotonic()
        self._started = time.monotonic()
        self.on_latency: Callable[[float], None] | None = None

    # -- start-up -------------------------------------------------------------------------------
    def restore_latest(self) -> SnapshotInfo | None:
        """Before :meth:`run`: restore the newest valid snapshot, if any (weights, plan, counters, offsets)."""
        if self.store is None:
            return None
        try:
            payload = self.store.load_latest_valid()
        except SnapshotNotFoundError:
            return None
        self._restore_payload(payload)
        return self._info(payload)

    def _restore_payload(self, payload: SnapshotPayload) -> None:
        self.learner.load_state_tensors(payload.tensors)
        plan = Plan.from_dict(payload.plan)
        if plan != self._plan:
            self.learner.apply_plan(plan)
            self._plan = plan
        self._plan_version = int(payload.meta.get("plan_version", self._plan_version))
        self.counters.restore(payload.counters)
        predicted = {int(p): int(o) for p, o in payload.meta.get("predicted_through", {}).items()}
        self.ledger.restore(predicted)
        self._seek_to = {int(p): int(o) for p, o in payload.offsets.get(self.topics.samples, {}).items()}
        self._last_snapshot_version = payload.version or 0

    # -- the loop -------------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set, then drain, snapshot and commit (SIGTERM path)."""
        self._loop_thread = threading.current_thread()
        kafka = self.settings.kafka
        # Committed offsets bound the duplicates a crash can leave unflagged: commit stored ones every second.
        # fetch.wait.max.ms 10 (librdkafka's default is 500): measured p99 of the broker hop 20 ms vs 258 ms
        # and of arrival → prediction 192 vs 306 ms (benchmarks/service/results/latency.md).
        defaults = {"auto.commit.interval.ms": 1000, "fetch.wait.max.ms": 10}
        consumer = Consumer({**defaults, **kafka.consumer_config()})
        producer = Producer(kafka.producer_config())
        self._consumer, self._producer = consumer, producer
        consumer.subscribe([self.topics.samples, self.topics.labels], on_assign=self._on_assign)
        self._state = TrainerState.RUNNING
        last_store = time.monotonic()
        try:
            while not stop.is_set():
                self._serve_requests()
                for message in consumer.consume(num_messages=256, timeout=0.05):
                    self._handle(message)
                producer.poll(0)
                if time.monotonic() - last_store >= OFFSET_STORE_INTERVAL_S:
                    self._store_offsets()
                    last_store = time.monotonic()
                self._maybe_periodic_snapshot()
        finally:
            self._state = TrainerState.STOPPING
            self._shutdown()

    def _shutdown(self) -> None:
        assert self._consumer is not None and self._producer is not None
        try:
            self.learner.drain()
            self._producer.flush(30)
            self._store_offsets()
            if self.store is not None and self.snapshot_on_stop:
                try:
                    self._save_snapshot({"reason": "shutdown"})
                except Exception as exc:  # a failed final snapshot must not lose the offsets commit
                    log.error("final snapshot failed: %s", exc)
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:  # _NO_OFFSET: auto-commit already committed all
                log.error("final commit failed: %s", exc)
        finally:
            self._serve_requests(closing=True)
            self._consumer.close()
            self.learner.close()

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
        log.debug("assigned %s; committed %s; snapshot offsets %s", partitions, committed, self._seek_to)
        for tp in committed:
            if tp.offset >= 0:
                self.ledger.known_predicted(tp.partition, tp.offset)
        for tp in samples:
            if tp.partition in self._seek_to:
                tp.offset = self._seek_to[tp.partition]
        consumer.assign(partitions)
        if self._on_assigned is not None:
            self._on_assigned()  # readiness: only now can the trainer take the stream

    def _handle(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.error(
                    "consume error on %s[%s]@%s: %s", message.topic(), message.partition(), message.offset(), error
                )
            return
        if message.topic() == self.topics.labels:
            self._handle_label(message)
            return
        partition, offset = int(message.partition() or 0), int(message.offset() or 0)
        with self.counters.lock:
            self.counters.items_received += 1
        self.ledger.add(partition, offset)
        decoded = self.decoder.decode(message.value())
        if isinstance(decoded, Rejection):
            self._dead_letter(message, decoded, partition, offset)
            return
        with self.counters.lock:
            item = self.counters.items_valid
            self.counters.items_valid += 1
            self.counters.last_event_time_ms = decoded.event_time_ms
        if self._on_arrival is not None:
            self._on_arrival(decoded.event_time_ms, partition)
        outcome = _Outcome(partition, offset)
        prediction, verdict = self.learner.arrive(item, decoded.x, decoded.label, lambda: self._finish(outcome))
        has_label = decoded.label is not None
        correct = has_label and prediction.predicted_class == decoded.label
        duplicate = self.ledger.is_duplicate(partition, offset)
        with self.counters.lock:
            if has_label:
                self.counters.oacc.update(prediction.predicted_class, decoded.label)
            else:
                self.labels.remember(decoded.sample_id, prediction.predicted_class)
            if verdict.dispatched:
                self.counters.items_dispatched += 1
            else:
                self.counters.skipped[verdict.reason or "unknown"] += 1
            oacc = self.counters.oacc.get()
        latency = max(0.0, float(now_ms() - decoded.event_time_ms))
        out = messages_pb2.Prediction(
            sample_id=decoded.sample_id,
            sequence=decoded.sequence,
            predicted_class=prediction.predicted_class,
            confidence=prediction.confidence,
            has_label=has_label,
            correct=bool(correct),
            model_version=prediction.model_version,
            latency_ms=latency,
            online_accuracy=oacc,
            duplicate=duplicate,
            item=item,
            decision=_decision(verdict),
            worker=verdict.worker,
            plan_version=self._plan_version,
            task=decoded.task,
            stream=decoded.stream,
            predicted_time_ms=now_ms(),
            instance_id=self.instance_id,
            source_partition=partition,
            source_offset=offset,
        )
        assert self._producer is not None
        self._producer.produce(
            self.topics.predictions,
            out.SerializeToString(),
            key=decoded.sample_id.encode(),
            on_delivery=lambda err, _msg: self._delivered(err, outcome, duplicate, latency),
        )
        self.ledger.mark_predicted(partition, offset)

    def _delivered(self, err: KafkaError | None, outcome: _Outcome, duplicate: bool, latency: float) -> None:
        if err is not None:
            log.error("prediction for %s@%s not delivered: %s", outcome.partition, outcome.offset, err)
            return  # the offset stays unfinished: a restart re-reads it (at least once)
        with self.counters.lock:
            self.counters.predictions_published += 1
            self.counters.duplicates_published += int(duplicate)
            self.counters.latency_ms.update(latency)
        if self.on_latency is not None:
            self.on_latency(latency)
        self._finish(outcome)

    def _finish(self, outcome: _Outcome) -> None:
        with self._outcome_lock:
            outcome.remaining -= 1
            done = outcome.remaining == 0
        if done:
            self.ledger.finish(outcome.partition, outcome.offset)

    def _dead_letter(self, message: Message, rejection: Rejection, partition: int, offset: int) -> None:
        value, headers = dead_letter(message, rejection)
        log.warning(
            "dead-lettered %s[%s]@%s: %s (%s)", message.topic(), partition, offset, rejection.reason, rejection.detail
        )
        with self.counters.lock:
            self.counters.dead_lettered[rejection.reason] += 1

        def delivered(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                self.ledger.finish(partition, offset)
            else:
                log.error("DLQ write for %s[%s]@%s failed: %s", message.topic(), partition, offset, err)

        assert self._producer is not None
        self._producer.produce(self.topics.dlq, value, key=message.key(), headers=headers, on_delivery=delivered)

    def _handle_label(self, message: Message) -> None:
        label = messages_pb2.Label()
        try:
            label.ParseFromString(message.value() or b"")
        except Exception as exc:  # protobuf's DecodeError; a bad label must not stop the stream
            log.warning(
                "undecodable label at %s[%s]@%s: %s", message.topic(), message.partition(), message.offset(), exc
            )
            return
        with self.counters.lock:
            correct = self.labels.join(label.sample_id, int(label.label))
            if correct is not None:
                self.counters.labels_joined += 1
                self.counters.oacc.update(1 if correct else 0, 1)
        assert self._consumer is not None
        self._consumer.store_offsets(message=message)

    def _store_offsets(self) -> None:
        assert self._consumer is not None
        offsets = [TopicPartition(self.topics.samples, p, o) for p, o in self.ledger.resume_offsets().items()]
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:  # e.g. a partition revoked meanwhile
                log.warning("storing offsets failed: %s", exc)

    # -- requests from the control plane, run on the loop thread -----------------------------------
    def _on_loop(self, fn: Callable[[], T]) -> T:
        if self._loop_thread is None or threading.current_thread() is self._loop_thread:
            return fn()
        future: Future[T] = Future()
        self._requests.put((fn, future))
        return future.result()

    def _serve_requests(self, *, closing: bool = False) -> None:
        while True:
            try:
                fn, future = self._requests.get_nowait()
            except queue.Empty:
                return
            if closing:
                future.set_exception(RuntimeError("the trainer is stopping"))
                continue
            with self._paused():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

    def _paused(self) -> _Pause:
        return _Pause(self)

    # -- TrainerPort ------------------------------------------------------------------------------
    def current_plan(self) -> tuple[Plan, int]:
        return self._plan, self._plan_version

    def apply_plan(self, plan: Plan, version: int) -> AppliedPlan:
        def swap() -> AppliedPlan:
            start = time.monotonic()
            previous = self._state
            self._state = TrainerState.REPLANNING
            try:
                self.learner.drain()
                self.learner.apply_plan(plan)
                self._plan, self._plan_version = plan, version
                with self.counters.lock:
                    self.counters.replans += 1
            finally:
                self._state = previous
            return AppliedPlan(version, time.monotonic() - start, now_ms())

        return self._on_loop(swap)

    def status(self) -> TrainerStatus:
        stats = self.learner.stats()
        c = self.counters
        with c.lock:
            latency = c.latency_ms.get()
            lag = max(0.0, (now_ms() - c.last_event_time_ms) / 1000) if c.last_event_time_ms else 0.0
            elapsed = max(1e-9, time.monotonic() - self._started)
            return TrainerStatus(
                state=self._state,
                instance_id=self.instance_id,
                items_received=c.items_received,
                items_valid=c.items_valid,
                items_dispatched=c.items_dispatched,
                predictions_published=c.predictions_published,
                duplicates_published=c.duplicates_published,
                backward_passes=int(stats.get("backward_passes", 0)),
                labels_joined=c.labels_joined,
                skipped_by_reason=dict(c.skipped),
                dead_lettered_by_reason=dict(c.dead_lettered),
                labelled_predictions=c.oacc.count,
                correct_predictions=c.oacc.correct,
                online_accuracy=c.oacc.get(),
                budget_bytes=self._plan.budget_bytes,
                planned_bytes=self._plan.predicted_bytes,
                measured_bytes=int(stats.get("measured_bytes", 0)),  # peak under the plan in force
                lag_items=self.ledger.unfinished(),
                lag_seconds=lag,
                items_per_second=c.items_valid / elapsed,
                latency_ms_p50=float(latency.get("p50", 0.0)),
                latency_ms_p99=float(latency.get("p99", 0.0)),
                model_version=int(stats.get("updates", 0)),
                plan_version=self._plan_version,
                replans=c.replans,
                pauses=c.pauses,
                last_snapshot_version=self._last_snapshot_version,
            )

    def save_snapshot(self, metadata: Mapping[str, str]) -> SnapshotInfo:
        return self._on_loop(lambda: self._save_snapshot(metadata))

    def restore_snapshot(self, version: int | None) -> SnapshotInfo:
        def restore() -> SnapshotInfo:
            store = self._require_store()
            try:
                payload = store.load(version) if version is not None else store.load_latest_valid()
            except SnapshotNotFoundError as exc:
                raise SnapshotNotFound(str(exc)) from exc
            self.learner.drain()
            self._restore_payload(payload)
            if self._consumer is not None:
                for partition, offset in self._seek_to.items():
                    try:
                        self._consumer.seek(TopicPartition(self.topics.samples, partition, offset))
                    except KafkaException as exc:  # not assigned to this replica (any more)
                        log.warning("seek %s[%s] to %s failed: %s", self.topics.samples, partition, offset, exc)
            return self._info(payload)

        return self._on_loop(restore)

    def list_snapshots(self, verify: bool) -> list[SnapshotInfo]:
        store = self._require_store()
        out = []
        for status in store.list_snapshots(verify=verify):
            if status.manifest is None:
                out.append(SnapshotInfo(status.version, self.instance_id, valid=False, error=status.error))
            else:
                info = self._manifest_info(status.manifest)
                out.append(dataclasses.replace(info, valid=status.valid, error=status.error))
        return out

    # -- snapshots ---------------------------------------------------------------------------------
    def _require_store(self) -> SnapshotStore:
        if self.store is None:
            raise SnapshotNotFound("snapshots are off: the trainer has no Redis store configured")
        return self.store

    def _save_snapshot(self, metadata: Mapping[str, str]) -> SnapshotInfo:
        store = self._require_store()
        start = time.monotonic()
        previous = self._state
        self._state = TrainerState.SNAPSHOTTING
        try:
            self.learner.drain()
            if self._producer is not None:
                self._producer.flush(30)
            payload = SnapshotPayload(
                tensors=self.learner.state_tensors(),
                plan=self._plan.to_dict(),
                offsets={self.topics.samples: self.ledger.resume_offsets()},
                counters=self.counters.to_snapshot(),
                meta={
                    "plan_version": self._plan_version,
                    "predicted_through": {str(p): o for p, o in self.ledger.predicted_through.items()},
                    "instance_id": self.instance_id,
                    **dict(metadata),
                },
            )
            version = store.save(payload)
            store.prune(self.settings.redis.keep)
            self._snapshot_health(True)
        except Exception:
            self._snapshot_health(False)
            raise
        finally:
            self._state = previous
        self._last_snapshot_version = version
        self._last_snapshot_time = time.monotonic()
        return self._manifest_info(store.manifest(version), seconds=time.monotonic() - start)

    def _maybe_periodic_snapshot(self) -> None:
        interval = self.settings.redis.snapshot_interval_s
        if self.store is None or interval <= 0 or time.monotonic() - self._last_snapshot_time < interval:
            return
        with self._paused():
            try:
                self._save_snapshot({"reason": "periodic"})
            except Exception as exc:  # snapshots failing degrade the service; the stream goes on
                log.error("periodic snapshot failed: %s", exc)
                self._last_snapshot_time = time.monotonic()

    def _info(self, payload: SnapshotPayload) -> SnapshotInfo:
        if self.store is not None and payload.version:
            return self._manifest_info(self.store.manifest(payload.version))
        return SnapshotInfo(
            version=payload.version or 0,
            instance_id=self.instance_id,
            offsets=_offsets(payload.offsets),
            plan_version=int(payload.meta.get("plan_version", 0)),
        )

    def _manifest_info(self, manifest: SnapshotManifest, *, seconds: float = 0.0) -> SnapshotInfo:
        return SnapshotInfo(
            version=manifest.version,
            instance_id=manifest.instance_id,
            created_time_ms=manifest.created_time_ms,
            chunks=len(manifest.chunks),
            total_bytes=manifest.total_bytes,
            sha256=manifest.sha256,
            offsets=_offsets(manifest.offsets),
            plan_version=int(manifest.meta.get("plan_version", 0)),
            metadata={k: str(v) for k, v in manifest.meta.items() if isinstance(v, str)},
            seconds=seconds,
        )


class _Pause:
    """Pauses consumption of the assigned partitions (counted) for a re-plan or a snapshot."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.partitions: list[TopicPartition] = []

    def __enter__(self) -> None:
        consumer = self.trainer._consumer
        if consumer is not None:
            self.partitions = consumer.assignment()
            if self.partitions:
                consumer.pause(self.partitions)
        with self.trainer.counters.lock:
            self.trainer.counters.pauses += 1

    def __exit__(self, *exc: object) -> None:
        consumer = self.trainer._consumer
        if consumer is not None and self.partitions:
            consumer.resume(self.partitions)


def _decision(verdict: Verdict) -> int:
    if verdict.dispatched:
        return int(messages_pb2.TRAINING_DECISION_DISPATCHED)
    return int(DECISIONS.get(verdict.reason, messages_pb2.TRAINING_DECISION_UNSPECIFIED))


def _offsets(offsets: Mapping[str, Mapping[int, int]]) -> tuple[PartitionOffset, ...]:
    return tuple(
        PartitionOffset(topic, int(p), int(o)) for topic, parts in offsets.items() for p, o in sorted(parts.items())
    )
