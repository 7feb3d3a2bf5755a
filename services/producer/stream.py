"""The producer: streams a dataset into ``<prefix>.samples`` at a paced rate (DESIGN §1, §4).

    producer = SampleProducer(dataset, settings.kafka, settings.producer)
    report = producer.run()        # blocks; producer.stop() (thread- and signal-safe) ends it cleanly
    print(report.summary())

- **Records**: value = a serialized ``ferret.v1.Sample`` (:class:`services.kafka.record_codec.SampleEncoder`), key =
  the sample id ``<stream>/<sequence>``, header ``content-type`` naming the message
  (:mod:`services.kafka.content_type`); the idempotent producer (acks=all) partitions by key with
  murmur2, so items spread over the partitions and a label keyed by the same id lands on the same
  partition index of ``<prefix>.labels`` (both topics have the same count when this producer creates them).
- **Labels** (``labels``): ``with-sample`` puts the label in the Sample; ``delayed`` sends a
  ``ferret.v1.Label`` to ``<prefix>.labels`` ``label_delay_s`` after its sample (still-pending labels are
  sent at once when the run stops); ``none`` sends no label at all.
- **Declared rate**: with a ``rate``, every sample record carries the headers ``ferret.rate`` and
  ``ferret.partitions`` (:mod:`services.kafka.rate_headers`), so a trainer plans for this stream before it has
  measured it.
- **Pacing**: a token bucket (``rate`` items/s, ``burst`` items back to back) on the monotonic clock; the
  next send time is reserved before waiting, so late wake-ups are caught up (within ``burst``) rather
  than drifting. Waits are deadline waits on the stop event that keep serving delivery reports.
  ``rate=None`` sends as fast as the client takes records (a full local queue waits for deliveries).
- **Start**: the stream's clock (the pacing and the first event time) starts only once the client can
  deliver: an idempotent client has its producer id (:mod:`services.producer.ready`; without the wait a new
  client's first ~0.5 s of records were held and delivered together). ``ProduceReport.ready_s`` says how
  long that took; after :data:`services.producer.ready.READY_TIMEOUT_S`, or with every broker down, the
  stream starts anyway (records then wait in the client).
- **Counts**: every delivery report is checked; failed deliveries, and records still undelivered when
  the final flush times out, are counted in the :class:`ProduceReport` with the first error.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ferret_core.data import Dataset
from ferret_core.errors import ConfigError, FerretError
from services.config import KafkaSettings, ProducerSettings
from services.kafka import content_type
from services.kafka.admin import ensure_topics
from services.kafka.rate_headers import HeaderValue, rate_headers
from services.kafka.record_codec import SampleEncoder, now_ms
from services.producer.ready import ProducerReadiness, Readiness
from services.proto_gen.ferret.v1.messages_pb2 import Label, Sample

log = logging.getLogger(__name__)

_MAX_WAIT_S = 0.05  # longest single wait, so a stop request is seen quickly
_PROGRESS_EVERY_S = 0.1
# Every record names its message (services.kafka.content_type; docs/predictions.md "Record headers").
SAMPLE_HEADERS = [content_type.header(Sample)]
LABEL_HEADERS: list[tuple[str, HeaderValue]] = [content_type.header(Label)]


class ProducerError(FerretError, RuntimeError):
    """The producer could not start or run (not a failed delivery: those are counted in the report)."""


class ProgressSink(Protocol):
    """What the producer reports progress to (a ``tqdm`` bar fits)."""

    def update(self, n: int) -> Any: ...


class TokenBucket:
    """Pacing at ``rate`` items/s with ``burst`` items of credit; ``clock`` is monotonic seconds.

    :meth:`reserve` takes one item's token at once and returns the monotonic time when the item may go;
    a caller that wakes up late has the lateness credited to the following items (up to ``burst``).
    """

    def __init__(self, rate: float, burst: int = 1, clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or burst < 1:
            raise ConfigError(f"token bucket needs rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate = float(rate)
        self.burst = int(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def reserve(self) -> float:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate) - 1.0
        self._last = now
        return now if self._tokens >= 0 else now - self._tokens / self.rate


@dataclass
class ProduceReport:
    """What a run produced. ``failed`` includes records still undelivered when the final flush timed out."""

    topic: str
    stream: str
    produced: int = 0
    delivered: int = 0
    failed: int = 0
    labels_produced: int = 0
    labels_delivered: int = 0
    labels_failed: int = 0
    seconds: float = 0.0
    stopped: bool = False  # ended by stop() before the end of the stream
    fatal: bool = False  # the client hit a fatal error (e.g. of the idempotent producer) and stopped
    first_error: str | None = None
    ready: bool = False  # the client could deliver (an idempotent one had its producer id) before the first record
    ready_s: float = 0.0  # seconds from the client's creation to the stream's start (the wait for ``ready``)
    per_partition: dict[int, int] = field(default_factory=dict)  # delivered samples per partition

    @property
    def rate(self) -> float:
        """Samples produced per second over the run (up to the end of the final flush)."""
        return self.produced / self.seconds if self.seconds > 0 else 0.0

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.labels_failed == 0 and not self.fatal

    def summary(self) -> str:
        labels = f" (+{self.labels_produced} labels, {self.labels_failed} failed)" if self.labels_produced else ""
        stopped = ", stopped early" if self.stopped else ""
        return (
            f"produced {self.produced} samples to {self.topic}{labels}: delivered {self.delivered}, "
            f"failed {self.failed} in {self.seconds:.2f} s ({self.rate:,.0f} items/s){stopped}"
        )

    def failure_reason(self) -> str | None:
        """One line naming the failed deliveries, or None when every record was delivered."""
        if self.ok:
            return None
        if self.fatal and not (self.failed or self.labels_failed):
            return f"the producer stopped on a fatal error: {self.first_error}"
        labels = f" and {self.labels_failed} of {self.labels_produced} labels" if self.labels_failed else ""
        return f"{self.failed} of {self.produced} samples{labels} were not delivered: {self.first_error}"


class SampleProducer:
    """Streams ``dataset`` into ``<prefix>.samples`` as ``options`` say; the Kafka client is created in
    :meth:`run` and closed (flushed) before it returns. An instance runs once.

    ``progress`` (an attribute, settable) gets ``update(n)`` as items are produced. ``create_topics``:
    create missing topics first with ``kafka.sample_partitions`` partitions
    (:func:`services.kafka.admin.ensure_topics`, which uses plain bootstrap servers, no security).
    """

    def __init__(
        self,
        dataset: Dataset,
        kafka: KafkaSettings,
        options: ProducerSettings,
        *,
        progress: ProgressSink | None = None,
        create_topics: bool = True,
    ) -> None:
        self.dataset = dataset
        self.kafka = kafka
        self.options = options
        self.stream = options.stream or dataset.name
        self.topics = kafka.topics
        self.progress = progress
        self._create_topics = create_topics
        self._stop = threading.Event()
        self._x, self._y, self._tasks = _split(dataset, options.split)
        if len(self._y) == 0:
            raise ConfigError(f"the {options.split} split of {dataset.name} is empty: nothing to produce")
        self._encoder = SampleEncoder(self.stream, dataset.input_shape, self._x.dtype.name)
        self._labels: collections.deque[tuple[float, str, int]] = collections.deque()
        self._report = ProduceReport(topic=self.topics.samples, stream=self.stream)
        self._lock = threading.Lock()
        self._seen_errors: set[int] = set()
        self._ran = False
        self._sample_headers: list[tuple[str, HeaderValue]] = list(SAMPLE_HEADERS)
        self._readiness: ProducerReadiness | None = None

    @property
    def total(self) -> int | None:
        """Items this run will produce (None: until stopped)."""
        if self.options.items is not None:
            return self.options.items
        return None if self.options.loop else len(self._y)

    def stop(self) -> None:
        """Ask :meth:`run` to stop after the current item, send pending labels, flush and return.
        Safe from signal handlers and other threads."""
        self._stop.set()

    def snapshot(self) -> ProduceReport:
        """A copy of the counts so far (safe from other threads)."""
        with self._lock:
            return dataclasses.replace(self._report, per_partition=dict(self._report.per_partition))

    def run(self) -> ProduceReport:
        """Produce the stream; return the final counts (check :attr:`ProduceReport.ok`). Once per instance."""
        if self._ran:
            raise ProducerError("a SampleProducer runs once: make a new one for another run")
        self._ran = True
        if self._create_topics:
            self._ensure_topics()
        began = time.monotonic()
        config = self.kafka.producer_config()
        self._readiness = ProducerReadiness(config)
        client = Producer({**config, **self._readiness.client_config(), "error_cb": self._on_client_error})
        try:
            self._wait_until_ready(client, self._readiness, began)
            if self.options.rate is not None:
                self._sample_headers = [*SAMPLE_HEADERS, *rate_headers(self.options.rate, self._partitions(client))]
            self._produce_all(client)
        finally:
            self._finish(client)
            with self._lock:
                self._report.seconds = time.monotonic() - began
        return self.snapshot()

    def _wait_until_ready(self, client: Producer, readiness: ProducerReadiness, began: float) -> Readiness:
        """Before the stream's clock starts: wait until the client can deliver (see the module docstring)."""
        result = readiness.wait(client, self.topics.samples, stop=self._stop)
        with self._lock:
            self._report.ready = result.ready
            self._report.ready_s = round(time.monotonic() - began, 4)
        if result.ready:
            log.info("producer ready after %.3f s: %s", self._report.ready_s, result.reason)
        elif not self._stop.is_set():
            log.warning("starting the stream before the producer is ready (%s): its first records wait", result.reason)
        return result

    # --- the loop ---------------------------------------------------------------------------------------

    def _produce_all(self, client: Producer) -> None:
        options = self.options
        bucket = TokenBucket(options.rate, options.burst) if options.rate is not None else None
        delayed = options.labels == "delayed"
        with_label = options.labels == "with-sample"
        x, y, tasks = self._x, self._y, self._tasks
        reported, last_progress = 0, time.monotonic()
        for sequence, row in enumerate(self._rows()):
            if bucket is not None and not self._wait_until(client, bucket.reserve()):
                break
            if self._stop.is_set():
                break
            label = int(y[row])
            ident, value = self._encoder.encode(
                x[row].tobytes(),
                sequence,
                label=label if with_label else None,
                task=0 if tasks is None else int(tasks[row]),
            )
            if not self._send(client, ident, value, is_sample=True):
                break
            if delayed:
                self._labels.append((time.monotonic() + options.label_delay_s, ident, label))
            if self._labels:
                self._send_due_labels(client)
            client.poll(0)
            if self.progress is not None and (now := time.monotonic()) - last_progress >= _PROGRESS_EVERY_S:
                self.progress.update(sequence + 1 - reported)
                reported, last_progress = sequence + 1, now
        if self.progress is not None:
            self.progress.update(self._report.produced - reported)
        while self._labels and not self._stop.is_set():  # the stream ended: wait for the last labels' times
            self._wait_until(client, self._labels[0][0])
        self._send_due_labels(client, everything=True)
        with self._lock:
            total = self.total
            self._report.stopped = self._stop.is_set() and (total is None or self._report.produced < total)

    def _rows(self) -> Iterator[int]:
        n = len(self._y)
        order = np.random.default_rng(self.options.seed).permutation(n) if self.options.shuffle else np.arange(n)
        total = self.total
        cycle = total is None or total > n
        rows = itertools.cycle(order.tolist()) if cycle else iter(order.tolist())
        return rows if total is None else itertools.islice(rows, total)

    def _wait_until(self, client: Producer, deadline: float) -> bool:
        """Serve delivery reports and due labels until ``deadline``; False when stopped meanwhile."""
        while True:
            if self._labels:
                self._send_due_labels(client)
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            if self._labels:
                left = min(left, max(0.0, self._labels[0][0] - time.monotonic()))
            if self._stop.wait(min(left, _MAX_WAIT_S)):
                return False
            client.poll(0)

    def _send_due_labels(self, client: Producer, *, everything: bool = False) -> None:
        now = time.monotonic()
        while self._labels and (everything or self._labels[0][0] <= now):
            _, ident, label = self._labels.popleft()
            value = Label(sample_id=ident, label=label, event_time_ms=now_ms()).SerializeToString()
            if not self._send(client, ident, value, is_sample=False):
                return

    def _send(self, client: Producer, key: str, value: bytes, *, is_sample: bool) -> bool:
        """Hand one sample or label to the client, waiting while its local queue is full; False when
        stopped while waiting."""
        topic = self.topics.samples if is_sample else self.topics.labels
        on_delivery = self._on_sample if is_sample else self._on_label
        headers = self._sample_headers if is_sample else LABEL_HEADERS
        while True:
            try:
                client.produce(topic, value=value, key=key.encode(), on_delivery=on_delivery, headers=headers)
            except BufferError:
                if self._stop.is_set():
                    return False
                client.poll(_MAX_WAIT_S)  # the local queue is full: wait for deliveries
                continue
            except KafkaException as exc:
                self._count_failure(is_sample, f"{topic}: {_describe(exc)}", produced=True)
                return True
            with self._lock:
                if is_sample:
                    self._report.produced += 1
                else:
                    self._report.labels_produced += 1
            return True

    def _finish(self, client: Producer) -> None:
        undelivered = client.flush(self.options.flush_timeout_s)
        if undelivered:
            with self._lock:
                report = self._report
                samples = report.produced - report.delivered - report.failed
                labels = report.labels_produced - report.labels_delivered - report.labels_failed
                report.failed += samples
                report.labels_failed += labels
                timeout = self.options.flush_timeout_s
                report.first_error = report.first_error or (
                    f"{undelivered} records still undelivered after the {timeout:g} s flush timeout"
                )

    def _partitions(self, client: Producer) -> int:
        """Partitions of the samples topic (for the declared rate's headers; 1 when metadata fails)."""
        try:
            topic = client.list_topics(self.topics.samples, timeout=10).topics.get(self.topics.samples)
        except KafkaException as exc:
            log.warning("reading %s's partitions failed (%s): declaring the rate for 1", self.topics.samples, exc)
            return 1
        return max(1, len(topic.partitions)) if topic is not None and topic.partitions else 1

    def _ensure_topics(self) -> None:
        counts = ensure_topics(
            self.kafka.bootstrap_servers, self.kafka.topic_prefix, sample_partitions=self.kafka.sample_partitions
        )
        samples, labels = counts[self.topics.samples], counts[self.topics.labels]
        if self.options.labels == "delayed" and samples != labels:
            log.warning(
                "%s has %d partitions but %s has %d: a late label may land on another replica than its sample",
                self.topics.samples,
                samples,
                self.topics.labels,
                labels,
            )

    # --- callbacks (called from poll/flush on this thread) ------------------------------------------------

    def _on_sample(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._count_failure(True, f"{msg.topic()}: {err.name()}: {err.str()}")
            return
        partition = msg.partition() or 0
        with self._lock:
            self._report.delivered += 1
            self._report.per_partition[partition] = self._report.per_partition.get(partition, 0) + 1

    def _on_label(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self._count_failure(False, f"{msg.topic()}: {err.name()}: {err.str()}")
            return
        with self._lock:
            self._report.labels_delivered += 1

    def _count_failure(self, is_sample: bool, error: str, *, produced: bool = False) -> None:
        with self._lock:
            report = self._report
            if is_sample:
                report.failed += 1
                report.produced += 1 if produced else 0
            else:
                report.labels_failed += 1
                report.labels_produced += 1 if produced else 0
            if report.first_error is None:
                report.first_error = error
                log.error("delivery failed: %s", error)

    def _on_client_error(self, err: KafkaError) -> None:
        if self._readiness is not None:
            self._readiness.note_error(err)
        if err.fatal():
            with self._lock:
                self._report.fatal = True
                self._report.first_error = self._report.first_error or f"fatal: {err.name()}: {err.str()}"
            log.error("producer fatal error: %s: %s; stopping", err.name(), err.str())
            self._stop.set()
        elif err.code() not in self._seen_errors:  # librdkafka repeats these (e.g. while a broker is down)
            self._seen_errors.add(err.code())
            log.warning("producer: %s: %s", err.name(), err.str())


def _split(dataset: Dataset, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    if split == "train":
        return dataset.x_train, dataset.y_train, dataset.tasks_train
    if split == "test":
        return dataset.x_test, dataset.y_test, dataset.tasks_test
    raise ConfigError(f"unknown split {split!r}: expected train or test")


def _describe(exc: KafkaException) -> str:
    error = exc.args[0] if exc.args else None
    return f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
