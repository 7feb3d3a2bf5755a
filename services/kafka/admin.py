"""Topic set-up and counting (DESIGN §4 "Kafka topics" and "Counting").

- :func:`ensure_topics` creates ``<prefix>.samples`` (K partitions), ``<prefix>.labels`` (K, so a
  late label lands on the partition index of its sample and thus on the same replica under the range
  assignor), ``<prefix>.predictions`` (K unless told) and ``<prefix>.samples.dlq`` (K: the trainer writes
  each sample partition's outcomes to the partition of the same index, services/trainer/outcomes.py)
  and ``<prefix>.events`` (1: the model's rollbacks, promotions and drift, in order), idempotently.
- :func:`count_distinct` counts the records and the distinct keys (or ids read from the values) of a
  topic by consuming it from the beginning with a fresh, never-committing consumer, and stops after an
  idle timeout. Never use watermarks for counts: the embedded broker's are wrong (docs/local-stack.md).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from ferret_core.errors import ConfigError, FerretError

log = logging.getLogger(__name__)

DEFAULT_PREFIX = "ferret"


class KafkaSetupError(FerretError, RuntimeError):
    """Topics could not be created, described or read."""


@dataclass(frozen=True)
class TopicNames:
    """The topic names for a prefix (default ``ferret``)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        legal = all(c.isalnum() or c in "._-" for c in self.prefix)
        if not self.prefix or not legal or len(self.prefix) > 200:
            raise ConfigError(
                f"invalid topic prefix {self.prefix!r}: use 1-200 characters from letters, digits, '.', "
                "'_' and '-' (e.g. ferret)"
            )

    @property
    def samples(self) -> str:
        return f"{self.prefix}.samples"

    @property
    def predictions(self) -> str:
        return f"{self.prefix}.predictions"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.samples.dlq"

    @property
    def labels(self) -> str:
        return f"{self.prefix}.labels"

    @property
    def events(self) -> str:
        """Rollbacks, promotions and drift (``ModelEvent``; one partition: few, ordered records)."""
        return f"{self.prefix}.events"

    def all(self) -> tuple[str, str, str, str]:
        return (self.samples, self.predictions, self.dlq, self.labels)


def _wrap(exc: KafkaException, what: str) -> KafkaSetupError:
    error = exc.args[0] if exc.args else None
    detail = f"{error.name()}: {error.str()}" if isinstance(error, KafkaError) else str(exc)
    return KafkaSetupError(f"{what}: {detail}")


def topic_partitions(
    bootstrap_servers: str, topics: tuple[str, ...] | list[str], timeout: float = 10.0
) -> dict[str, int]:
    """Partition counts of the given topics that exist (missing ones are left out)."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise _wrap(exc, f"could not read topic metadata from {bootstrap_servers}") from exc
    found: dict[str, int] = {}
    for name in topics:
        meta = metadata.topics.get(name)
        if meta is not None and meta.error is None and meta.partitions:
            found[name] = len(meta.partitions)
    return found


def ensure_topics(
    bootstrap_servers: str,
    prefix: str = DEFAULT_PREFIX,
    *,
    sample_partitions: int = 1,
    prediction_partitions: int | None = None,
    replication_factor: int = 1,
    timeout: float = 15.0,
) -> dict[str, int]:
    """Create the service's topics where missing; return every topic's partition count.

    Existing topics are kept as they are (a different partition count is logged, not changed: the
    embedded broker cannot add partitions). Raises :class:`KafkaSetupError` when the broker refuses or
    the topics do not show up in the metadata within ``timeout`` seconds.
    """
    if sample_partitions < 1 or (prediction_partitions is not None and prediction_partitions < 1):
        raise ConfigError(
            f"partition counts must be >= 1, got samples={sample_partitions}, predictions={prediction_partitions}"
        )
    names = TopicNames(prefix)
    wanted = {
        names.samples: sample_partitions,
        names.labels: sample_partitions,
        names.predictions: prediction_partitions or sample_partitions,
        names.dlq: sample_partitions,
        names.events: 1,
    }
    existing = topic_partitions(bootstrap_servers, list(wanted), timeout=timeout)
    missing = [n for n in wanted if n not in existing]
    if missing:
        admin = AdminClient({"bootstrap.servers": bootstrap_servers})
        futures = admin.create_topics(
            [NewTopic(n, num_partitions=wanted[n], replication_factor=replication_factor) for n in missing],
            operation_timeout=timeout,
            request_timeout=timeout,
        )
        for name, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue  # created meanwhile by another replica or run
                raise _wrap(exc, f"could not create topic {name} on {bootstrap_servers}") from exc
    deadline = time.monotonic() + timeout
    while True:  # topic metadata may lag the creation by a moment
        found = topic_partitions(bootstrap_servers, list(wanted), timeout=timeout)
        if len(found) == len(wanted):
            break
        if time.monotonic() >= deadline:
            raise KafkaSetupError(
                f"topics {sorted(set(wanted) - set(found))} did not appear on {bootstrap_servers} within "
                f"{timeout:g} s after creation"
            )
        time.sleep(0.05)
    for name, count in found.items():
        if count != wanted[name]:
            log.warning("topic %s exists with %d partitions (wanted %d); keeping it", name, count, wanted[name])
    return found


@dataclass(frozen=True)
class TopicCount:
    """What :func:`count_distinct` read."""

    topic: str
    records: int
    distinct: int
    per_partition: Mapping[int, int] = field(default_factory=dict)
    unkeyed: int = 0  # records whose id was None (not counted in ``distinct``)
    undecodable: int = 0  # records whose id function raised
    seconds: float = 0.0
    timed_out: bool = False  # stopped by ``max_seconds`` rather than by the idle timeout

    @property
    def duplicates(self) -> int:
        """Records beyond the first for each id."""
        return self.records - self.unkeyed - self.undecodable - self.distinct


def message_key(message: Message) -> Hashable | None:
    """The default id of a record: its key bytes."""
    key = message.key()
    return bytes(key) if key is not None else None


def count_distinct(
    bootstrap_servers: str,
    topic: str,
    *,
    id_of: Callable[[Message], Hashable | None] = message_key,
    idle_timeout: float = 2.0,
    max_seconds: float = 300.0,
    consumer_config: Mapping[str, Any] | None = None,
) -> TopicCount:
    """Count the records and distinct ids of ``topic`` by reading every partition from the beginning.

    The consumer has a fresh group id, is assigned every partition explicitly (no group join, which
    costs half of ``session.timeout.ms`` on the embedded broker) and never commits. It stops when no
    record arrived for ``idle_timeout`` seconds, or after ``max_seconds`` (``timed_out``). ``id_of``
    maps a record to its id (default: the key); e.g. ``lambda m: Prediction.FromString(m.value())
    .sample_id``.
    """
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"ferret-count-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 6000,
    }
    config.update(consumer_config or {})
    consumer = Consumer(config)
    began = time.monotonic()
    ids: set[Hashable] = set()
    per_partition: dict[int, int] = {}
    records = unkeyed = undecodable = 0
    timed_out = False
    try:
        try:
            meta = consumer.list_topics(topic, timeout=10.0).topics.get(topic)
        except KafkaException as exc:
            raise _wrap(exc, f"could not read metadata of topic {topic} from {bootstrap_servers}") from exc
        if meta is None or meta.error is not None or not meta.partitions:
            reason = meta.error if meta is not None and meta.error is not None else "no partitions"
            raise KafkaSetupError(f"topic {topic} is not readable on {bootstrap_servers}: {reason}")
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in sorted(meta.partitions)])
        last_record = time.monotonic()
        while True:
            now = time.monotonic()
            if now - began >= max_seconds:
                timed_out = True
                break
            if now - last_record >= idle_timeout:
                break
            batch = consumer.consume(num_messages=1000, timeout=min(0.2, idle_timeout))
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaSetupError(f"reading {topic}: {error.name()}: {error.str()}")
                    log.warning("reading %s: %s", topic, error.str())
                    continue
                records += 1
                partition = message.partition() or 0
                per_partition[partition] = per_partition.get(partition, 0) + 1
                try:
                    ident = id_of(message)
                except Exception:
                    undecodable += 1
                    log.warning("%s[%d]@%s: could not read the id", topic, partition, message.offset(), exc_info=True)
                    continue
                if ident is None:
                    unkeyed += 1
                else:
                    ids.add(ident)
            if batch:
                last_record = time.monotonic()
    finally:
        consumer.close()
    return TopicCount(
        topic=topic,
        records=records,
        distinct=len(ids),
        per_partition=dict(sorted(per_partition.items())),
        unkeyed=unkeyed,
        undecodable=undecodable,
        seconds=time.monotonic() - began,
        timed_out=timed_out,
    )
