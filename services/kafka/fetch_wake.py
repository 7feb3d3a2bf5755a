"""Resume consumption without librdkafka's idle wait.

``Consumer.resume()`` only flips the partitions' state on librdkafka's main thread: the broker thread that
fetches them re-decides what to fetch the next time it wakes up, and with every partition paused its fetch
list was empty, so it sleeps until its idle timeout. Measured (``benchmarks/service/resume_probe.py``,
``results/resume_probe.md``; librdkafka 2.16): after a 10-ms pause the first record comes 0.3–1 s after
``resume()``; in the trainer a pause as short as the start-up re-plan's leaves about a second of the
stream in the broker (``docs/history.md``).

:func:`wake_fetcher` wakes those broker threads: one ``offsets_for_times`` call (``ListOffsets`` for the
latest offset, sent to every partition's leader at once) is served by each leader's broker thread, which
then re-decides its fetch list after the resume (the call waits for the replies: one round trip). The value is
not used (Tansu's watermarks are unreliable); a failed request is only logged: the fetcher then starts at
its idle timeout, as without the wake-up.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from confluent_kafka import OFFSET_END, KafkaException, TopicPartition

log = logging.getLogger(__name__)

WAKE_TIMEOUT_S = 1.0  # one round trip; never longer than the idle wait it saves


class ResumableConsumer(Protocol):
    """What :func:`resume_and_wake` uses of ``confluent_kafka.Consumer`` (tests pass fakes)."""

    def resume(self, partitions: list[TopicPartition]) -> None: ...

    def assignment(self) -> list[TopicPartition]: ...

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float = ...) -> list[TopicPartition]: ...


def wake_fetcher(consumer: ResumableConsumer, partitions: Sequence[TopicPartition] | None = None) -> bool:
    """One request to the leaders of ``partitions`` (default: the consumer's assignment), waiting for the
    replies; False when there was nothing to ask or the request failed (logged)."""
    targets = [
        TopicPartition(tp.topic, tp.partition, OFFSET_END)  # as a timestamp: "the latest offset"
        for tp in (consumer.assignment() if partitions is None else partitions)
    ]
    if not targets:
        return False
    try:
        consumer.offsets_for_times(targets, timeout=WAKE_TIMEOUT_S)
    except KafkaException as exc:
        log.debug("waking the fetchers of %d partitions: %s", len(targets), exc)
        return False
    return True


def resume_and_wake(consumer: ResumableConsumer, partitions: list[TopicPartition]) -> bool:
    """``consumer.resume(partitions)``, then :func:`wake_fetcher` for them (module docstring)."""
    consumer.resume(partitions)
    return wake_fetcher(consumer, partitions)
