"""Reading ``<prefix>.predictions``: :func:`iter_predictions` yields :class:`PredictionRecord` values.

    from services.predictions import iter_predictions, to_dataframe
    records = list(iter_predictions("127.0.0.1:9092", "ferret"))      # everything there now, then stop
    frame = to_dataframe(records)                                        # needs pandas (the `pandas` extra)

Two ways to read (docs/predictions.md "Reading"):

- **Ephemeral** (``group=None``, the default): every partition is assigned directly, from the beginning
  or from the end; nothing is committed, no consumer group is joined, so it never disturbs other readers
  and starts at once.
- **A consumer group** (``group="name"``): subscribes as a member of that group, so several readers share
  the partitions, and commits what it has yielded (an offset is stored only after the caller asked for
  the next record: at least once). A group with committed offsets resumes from them; ``from_beginning``
  applies only to partitions without one (``auto.offset.reset``).

From the end without a group, records stamped (Kafka timestamp) before the reader started are also left
out: the embedded broker's end offsets are wrong (docs/local-stack.md), and this keeps "only new ones"
true there. It stops after ``max_records`` records, after ``timeout`` seconds, or, unless ``follow``, once no record
came for ``idle_timeout`` seconds (caught up: the embedded broker's watermarks are wrong, so "the end" is
judged by silence, not by offsets). Closing the generator (``break``, a closed pipe) closes the consumer.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Generator, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaError, KafkaException, TopicPartition

from services.kafka.admin import TopicNames
from services.predictions.records import PredictionReadError, PredictionRecord

log = logging.getLogger(__name__)

POLL_S = 0.2


def iter_predictions(
    bootstrap_servers: str,
    topic_prefix: str = "ferret",
    *,
    from_beginning: bool = True,
    follow: bool = False,
    group: str | None = None,
    max_records: int | None = None,
    timeout: float | None = None,
    idle_timeout: float = 2.0,
    skip_invalid: bool = False,
    config: Mapping[str, Any] | None = None,
) -> Generator[PredictionRecord, None, None]:
    """Yield the predictions of ``<topic_prefix>.predictions`` in each partition's order.

    ``from_beginning``: start at the first record (else at the end: only new ones). ``follow``: keep
    waiting for new records (else stop once caught up, see the module docstring). ``group``: read as a
    member of that consumer group and commit (else ephemeral: nothing committed). ``max_records``,
    ``timeout`` (seconds): stop after that many records or that long. ``skip_invalid``: log and skip a
    record that is not a ``Prediction`` instead of raising :class:`PredictionReadError`. ``config``:
    more librdkafka properties (security: ``security.protocol``, ``sasl.*``, ``ssl.*``;
    ``services.config.KafkaSettings.client_config()`` gives them from Ferret's settings).
    """
    if max_records is not None and max_records < 0:
        raise PredictionReadError(f"max_records must be >= 0 or None, got {max_records}")
    if idle_timeout <= 0 or (timeout is not None and timeout < 0):
        raise PredictionReadError(f"timeouts must be positive, got idle_timeout={idle_timeout}, timeout={timeout}")
    topic = TopicNames(topic_prefix).predictions
    if max_records == 0:
        return
    consumer = Consumer(_consumer_config(bootstrap_servers, from_beginning, group, config))
    deadline = None if timeout is None else time.monotonic() + timeout
    # From the end without a group: also leave out records stamped before the start, for brokers whose
    # end offsets are wrong (the embedded one's count batches, so "the end" would replay most of a topic).
    not_before_ms = None if from_beginning or group is not None else int(time.time() * 1000)
    try:
        assigned = _start(consumer, topic, from_beginning, group)
        yielded = 0
        last_seen = time.monotonic()
        while deadline is None or time.monotonic() < deadline:
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            message = consumer.poll(wait)
            if not assigned.is_set():
                last_seen = time.monotonic()  # a group member is idle only once it has its partitions
            if message is None:
                if not follow and time.monotonic() - last_seen >= idle_timeout:
                    return
                continue
            error = message.error()
            if error is not None:
                _raise_unless_transient(error, topic)
                continue
            last_seen = time.monotonic()
            try:
                record = PredictionRecord.from_kafka(message)
            except PredictionReadError as exc:
                if not skip_invalid:
                    raise
                log.warning("skipped: %s", exc)
                continue
            if not_before_ms is not None and record.timestamp_ms is not None and record.timestamp_ms < not_before_ms:
                continue
            yield record
            if group is not None:  # the caller came back for the next one: this one is done
                _store(consumer, message)
            yielded += 1
            if max_records is not None and yielded >= max_records:
                return
    finally:
        consumer.close()  # a group member commits its stored offsets here


def _consumer_config(
    bootstrap_servers: str, from_beginning: bool, group: str | None, extra: Mapping[str, Any] | None
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap_servers,
        # The ephemeral reader never joins or commits; librdkafka still wants a group id.
        "group.id": group or f"ferret-reader-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": group is not None,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest" if from_beginning else "latest",
        "session.timeout.ms": 6000,
        "log_level": 3,
    }
    return {**config, **(extra or {})}


def _start(consumer: Consumer, topic: str, from_beginning: bool, group: str | None) -> threading.Event:
    """Assign every partition (ephemeral) or subscribe (group); raise when the topic does not exist."""
    try:
        metadata = consumer.list_topics(topic, timeout=10)
    except KafkaException as exc:
        raise PredictionReadError(f"cannot read the metadata of {topic}: {exc}") from None
    assigned = threading.Event()
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        raise PredictionReadError(
            f"topic {topic} does not exist on {consumer_bootstrap(metadata)}: check the bootstrap servers and "
            "the topic prefix (kafka.topic_prefix, --topic-prefix); a trainer creates it when it starts"
        )
    if group is None:
        start = OFFSET_BEGINNING if from_beginning else OFFSET_END
        consumer.assign([TopicPartition(topic, p, start) for p in sorted(described.partitions)])
        assigned.set()
        return assigned

    def on_assign(_consumer: Consumer, _partitions: list[TopicPartition]) -> None:
        assigned.set()

    consumer.subscribe([topic], on_assign=on_assign)
    return assigned


def _store(consumer: Consumer, message: Any) -> None:
    try:
        consumer.store_offsets(message=message)
    except KafkaException as exc:  # e.g. the partition was revoked meanwhile: it is read again elsewhere
        log.warning("could not store the offset of %s [%s] %s: %s", message.topic(), message.partition(),
                    message.offset(), exc)  # fmt: skip


def consumer_bootstrap(metadata: Any) -> str:
    brokers = getattr(metadata, "brokers", {}) or {}
    return ", ".join(f"{b.host}:{b.port}" for b in brokers.values()) or "the broker"


def _raise_unless_transient(error: KafkaError, topic: str) -> None:
    if error.code() == KafkaError._PARTITION_EOF:
        return
    if error.fatal() or error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
        raise PredictionReadError(f"reading {topic}: {error.name()}: {error.str()}")
    log.warning("reading %s: %s: %s (retrying)", topic, error.name(), error.str())
