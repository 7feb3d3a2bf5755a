"""Wait until a new idempotent producer can deliver, before a stream's clock starts.

librdkafka's idempotent producer holds every record until the broker has given it a producer id. It asks
for one when a metadata reply arrives and a broker connection is up, else on a fixed 500-ms retry timer
(``rd_kafka_idemp_pid_timer_restart`` in librdkafka's ``rdkafka_idempotence.c``). A new client's first
metadata reply comes over its bootstrap connection, which librdkafka closes in the same step as it learns
the broker's own id (``Sending TERMINATE to …/bootstrap``): that request finds no broker up ("No brokers
available for Idempotent producer") and the id waits for the timer. A stream that starts at once stamps
its first ~0.5 s of records, and they are all delivered together when the id comes
(``benchmarks/service/first_records.py``, ``results/first_records.md``: 0.5 s for the first record,
with or without ``list_topics`` first).

:class:`ProducerReadiness` makes the wait explicit: the client is made with librdkafka statistics on
(:meth:`ProducerReadiness.client_config`, every :data:`STATS_INTERVAL_MS`; they carry the idempotence
state), and :meth:`ProducerReadiness.wait` asks for the topic's metadata until the statistics report
``eos.idemp_state`` = ``Assigned``: each metadata reply from the broker's own connection runs the
producer-id request again, so the id comes one round trip after that connection is up instead of at the
timer. A client that is not idempotent is ready once the topic's metadata is there. The wait ends early
when the caller stops, or when every broker is down (``_ALL_BROKERS_DOWN``, :meth:`note_error`); after
``timeout_s`` the stream starts anyway (records then wait in the client for the id).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException

log = logging.getLogger(__name__)

STATS_INTERVAL_MS = 50  # how often librdkafka reports its state (the readiness signal); cheap when ready
READY_TIMEOUT_S = 10.0
_METADATA_TIMEOUT_S = 0.5  # one metadata request's wait, so a stop request is seen quickly
_POLL_S = 0.01


class MetadataClient(Protocol):
    """What the wait uses of ``confluent_kafka.Producer`` (tests pass fakes)."""

    def list_topics(self, topic: str | None = ..., timeout: float = ...) -> Any: ...

    def poll(self, timeout: float = ...) -> int: ...


@dataclass(frozen=True)
class Readiness:
    """How the wait ended: ``ready`` (the client can deliver; for an idempotent one: it has its producer
    id), after ``waited_s``; ``state``: the last idempotence state reported (None: no statistics seen)."""

    ready: bool
    waited_s: float
    state: str | None
    reason: str


class ProducerReadiness:
    """The readiness signal of one producer client: make the client with :meth:`client_config` merged into
    its configuration, pass :meth:`note_error` its errors, then :meth:`wait` before the first timed record.
    ``config`` is the client's configuration without this (to see whether it is idempotent)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.idempotent = _flag(config.get("enable.idempotence", False)) or "transactional.id" in config
        self._interval_ms = int(config.get("statistics.interval.ms", STATS_INTERVAL_MS))
        self._user_stats_cb = config.get("stats_cb")
        self._state: str | None = None
        self._assigned = threading.Event()
        self._brokers_down = threading.Event()

    def client_config(self) -> dict[str, Any]:
        """Merge into the client's configuration (after it, so the statistics callback is ours; an
        interval the configuration sets is kept)."""
        return {"statistics.interval.ms": self._interval_ms, "stats_cb": self.on_stats}

    def on_stats(self, stats: str) -> None:
        """librdkafka's statistics callback (called from ``poll``): notes the idempotence state."""
        if not self._assigned.is_set():
            state = json.loads(stats).get("eos", {}).get("idemp_state")
            self._state = state
            if state == "Assigned":
                self._assigned.set()
        if self._user_stats_cb is not None:
            self._user_stats_cb(stats)

    def note_error(self, error: KafkaError) -> None:
        """The client's ``error_cb``: every broker down ends the wait (nothing can make it ready soon)."""
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._brokers_down.set()

    @property
    def assigned(self) -> bool:
        """The idempotent client has reported its producer id."""
        return self._assigned.is_set()

    def wait(
        self,
        client: MetadataClient,
        topic: str,
        *,
        timeout_s: float = READY_TIMEOUT_S,
        stop: threading.Event | None = None,
    ) -> Readiness:
        """Ask for ``topic``'s metadata until the client can deliver (see the module docstring)."""
        began = time.monotonic()
        deadline = began + timeout_s

        def end(ready: bool, reason: str) -> Readiness:
            return Readiness(ready, round(time.monotonic() - began, 4), self._state, reason)

        while True:
            if stop is not None and stop.is_set():
                return end(False, "stopped")
            if self._brokers_down.is_set():
                return end(False, "all brokers down")
            left = deadline - time.monotonic()
            if left <= 0:
                return end(False, f"no producer id after {timeout_s:g} s (idempotence state {self._state})")
            try:  # each metadata reply runs librdkafka's producer-id request again
                client.list_topics(topic, timeout=min(_METADATA_TIMEOUT_S, left))
            except KafkaException as exc:
                log.debug("metadata for %s while waiting for the producer: %s", topic, exc)
                client.poll(0)  # serves the error callback (every broker down ends the wait)
                continue
            if not self.idempotent:
                return end(True, "metadata (not idempotent: no producer id to wait for)")
            if self._interval_ms <= 0:
                return end(True, "metadata (statistics off in the configuration: the producer id is not awaited)")
            # serve the statistics callback for two reports, then ask for metadata again
            until = min(deadline, time.monotonic() + 2 * self._interval_ms / 1000)
            while not self._assigned.is_set() and (now := time.monotonic()) < until:
                client.poll(min(_POLL_S, until - now))
            if self._assigned.is_set():
                return end(True, "producer id assigned")


def _flag(value: object) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1")
