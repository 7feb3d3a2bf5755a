"""The trainer's one producer, kept alive: outcomes (predictions, dead letters) go out through
:meth:`Publisher.send`, deliveries come back on the loop thread's :meth:`Publisher.poll`.

What the publisher handles so the record path does not have to:

- **too large**: a message librdkafka refuses at ``produce()`` for its size (``MSG_SIZE_TOO_LARGE``)
  raises :class:`MessageTooLarge` at once; a broker that refuses it later reports it through the delivery
  callback with the same code. The record path dead-letters the record (``too_large``) either way.
- **queue full** (``BufferError``): the producer is polled (deliveries served) and the message sent again,
  for up to :data:`QUEUE_FULL_WAIT_S`; only then does the error reach the record path.
- **fatal errors** (an idempotent producer's sequence lost after a broker restart, a fenced producer): the
  producer is rebuilt by the factory it was made with, and every message whose delivery failed with the
  fatal error, or that was still queued, is sent again on the new one, in order, with its own callback.
  A message that was in flight when the old producer died may have reached the broker: sent again, it can
  appear twice (at least once; each copy names its source partition and offset).
- **a stalled producer**: messages outstanding and no delivery reported for :data:`STALL_S` seconds is
  treated like a fatal error (rebuilt, resent). Measured against the embedded broker restarted under a
  running trainer (it loses every producer id): librdkafka's idempotent producer bumps its epoch, gets
  ``UNKNOWN_PRODUCER_ID`` again, and loops without ever reporting an error (tests/reliability/
  test_trainer_faults.py); a new producer gets a new id and delivers at once. Copies of in-flight messages
  can appear twice, as above.

Not thread-safe: the loop thread sends and polls (librdkafka calls the callbacks from ``poll``/``flush``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from ferret_core.errors import FerretError

log = logging.getLogger("ferret.trainer")

QUEUE_FULL_WAIT_S = 10.0
STALL_S = 15.0  # outstanding messages and no delivery report for this long: the producer is rebuilt
Delivered = Callable[[KafkaError | None, Message | None], None]
Headers = list[tuple[str, bytes]]


class ProducerLike(Protocol):
    """What the publisher uses of ``confluent_kafka.Producer`` (tests pass fakes)."""

    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ..., **kwargs: object) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def purge(self, in_queue: bool = ..., in_flight: bool = ..., blocking: bool = ...) -> None: ...


class MessageTooLarge(FerretError, ValueError):
    """The producer refused a message for its size (its ``message.max.bytes``)."""


@dataclass(frozen=True, slots=True)
class _Outgoing:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers | None
    partition: int | None
    on_delivery: Delivered


def too_large(error: KafkaError | None) -> bool:
    return error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE


class Publisher:
    """Sends through a producer from ``make(error_cb)`` and rebuilds it after a fatal error."""

    def __init__(
        self, make: Callable[[Callable[[KafkaError], None]], ProducerLike], stall_s: float | None = None
    ) -> None:
        self._make = make
        self.stall_s = STALL_S if stall_s is None else stall_s
        self._progress_at = time.monotonic()  # the last delivery report, or the first send after none was due
        self._fatal: KafkaError | None = None
        self._producer = make(self._on_error)
        self._outgoing: dict[int, _Outgoing] = {}  # sent, delivery not reported yet (by sequence)
        self._resend: list[tuple[int, _Outgoing]] = []  # lost with a dead producer, to send again
        self._sequence = 0
        self._tearing_down = False
        self.rebuilds = 0

    # -- sending -----------------------------------------------------------------------------------------
    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None,
        on_delivery: Delivered,
        headers: Headers | None = None,
        partition: int | None = None,
    ) -> None:
        """Queue one message; ``on_delivery(error, message)`` runs from a later :meth:`poll`/:meth:`flush`.
        Raises :class:`MessageTooLarge`, or ``KafkaException`` / ``BufferError`` when the producer still
        refuses after its rebuild or :data:`QUEUE_FULL_WAIT_S` of polling."""
        self._sequence += 1
        self._send(self._sequence, _Outgoing(topic, value, key, headers, partition, on_delivery))

    def _send(self, sequence: int, out: _Outgoing) -> None:
        self._recover()
        deadline = time.monotonic() + QUEUE_FULL_WAIT_S
        while True:
            try:
                self._produce(sequence, out)
                return
            except BufferError:  # the local queue is full: serve deliveries, then try again
                if time.monotonic() >= deadline:
                    raise
                self._producer.poll(0.05)
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if too_large(error):
                    raise MessageTooLarge(f"{out.topic}: {error.str() if error else exc}") from exc
                if isinstance(error, KafkaError) and error.fatal():
                    self._fatal = error
                    self._recover()
                    self._produce(sequence, out)  # once more on the new producer; raises if that fails too
                    return
                raise

    def _produce(self, sequence: int, out: _Outgoing) -> None:
        extra: dict[str, object] = {}
        if out.headers is not None:
            extra["headers"] = out.headers
        if out.partition is not None:
            extra["partition"] = out.partition
        if not self._outgoing:
            self._progress_at = time.monotonic()
        self._producer.produce(
            out.topic,
            out.value,
            key=out.key,
            on_delivery=lambda err, msg: self._delivered(sequence, err, msg),
            **extra,
        )
        self._outgoing[sequence] = out

    def _delivered(self, sequence: int, error: KafkaError | None, message: Message | None) -> None:
        out = self._outgoing.pop(sequence, None)
        if out is None:
            return
        self._progress_at = time.monotonic()
        if error is not None and (error.fatal() or error.code() == KafkaError._FATAL):
            self._fatal = self._fatal or error
        if error is not None and (self._fatal is not None or self._tearing_down):
            self._resend.append((sequence, out))  # the producer died under it: send it on the next one
            return
        out.on_delivery(error, message)

    # -- serving deliveries ------------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> int:
        served = int(self._producer.poll(timeout))
        if self._outgoing and self._fatal is None and time.monotonic() - self._progress_at > self.stall_s:
            self._fatal = KafkaError(
                KafkaError._TIMED_OUT,
                f"no delivery reported for {self.stall_s:.0f} s with {len(self._outgoing)} messages outstanding",
            )
        self._recover()
        return served

    def flush(self, timeout: float) -> int:
        """Deliver what is queued within ``timeout`` seconds; how many messages are still undelivered."""
        deadline = time.monotonic() + timeout
        left = int(self._producer.flush(timeout))
        while self._fatal is not None or self._resend:
            self._recover()
            left = int(self._producer.flush(max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
        return left + len(self._resend)

    # -- rebuilding ---------------------------------------------------------------------------------------
    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb``: a fatal error means this producer can send nothing more."""
        if error.fatal():
            self._fatal = error
        else:
            log.warning("producer: %s", error.str())

    def _recover(self) -> None:
        """After a fatal error: collect what the old producer still held, build a new one, resend."""
        if self._fatal is None and not self._resend:
            return
        if self._fatal is not None:
            error, self._fatal = self._fatal, None
            old = self._producer
            log.error("producer failed fatally (%s): rebuilding it and resending %d messages",
                      error.str(), len(self._outgoing))  # fmt: skip
            self._tearing_down = True
            try:
                old.purge(in_queue=True, in_flight=True, blocking=False)
                old.poll(0)  # their callbacks (purged or fatal) move them to the resend list
            except (KafkaException, RuntimeError) as exc:
                log.warning("producer: purging the failed producer: %s", exc)
            finally:
                self._tearing_down = False
            self._fatal = None
            self._resend.extend(sorted(self._outgoing.items()))  # anything it never reported
            self._outgoing.clear()
            self._producer = self._make(self._on_error)
            self._progress_at = time.monotonic()
            self.rebuilds += 1
        resend, self._resend = sorted(self._resend, key=lambda entry: entry[0]), []
        for sequence, out in resend:
            try:
                self._produce(sequence, out)
            except BufferError:
                self._resend.append((sequence, out))  # the next poll tries again
                self._producer.poll(0.05)
            except KafkaException as exc:
                out.on_delivery(exc.args[0] if exc.args else KafkaError(KafkaError._FAIL, str(exc)), None)
