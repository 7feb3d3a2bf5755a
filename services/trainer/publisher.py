"""The trainer's one producer, kept alive: outcomes (predictions, dead letters) go out through
:meth:`Publisher.send`, deliveries come back on the loop thread's :meth:`Publisher.poll`.

What the publisher handles so the record path does not have to:

- **too large**: a message librdkafka refuses at ``produce()`` for its size (``MSG_SIZE_TOO_LARGE``)
  raises :class:`MessageTooLarge` at once; a broker that refuses it later reports it through the delivery
  callback with the same code. The record path dead-letters the record (``too_large``) either way.
- **queue full** (``BufferError``): the producer is polled (deliveries served) and the message sent again,
  for up to :data:`QUEUE_FULL_WAIT_S`; only then does the error reach the record path.
- **an unusable producer** (:func:`unusable`: an idempotent producer's sequence lost after a broker restart,
  a fenced producer): the producer is rebuilt by the factory it was made with, and every message it still
  held is sent again on the new one, in order, with its own callback. librdkafka reports such a death on
  three paths, and each one rebuilds (measured on the embedded broker restarted under an idempotent
  producer whose producer id the restarted broker handed to another client: ``OUT_OF_ORDER_SEQUENCE_NUMBER``,
  tests/reliability/test_trainer_faults.py): the refused batch's delivery reports carry the broker's code
  with ``fatal()`` False, ``poll()`` then *raises* the fatal error (``fatal()`` True), and every later
  ``produce()`` raises ``_FATAL`` with ``fatal()`` False. A message whose first copy may be on the topic
  (in flight when the producer died, or never reported) is resent as a *flagged duplicate* when its sender
  gave a flagged copy (:class:`Reissue`: ``duplicate=true`` predictions, ``ferret.dlq.duplicate: true``
  dead letters); one the producer never sent (still queued: ``_PURGE_QUEUE``) or the broker refused
  (:data:`REFUSED`) is resent as it was. So every outcome arrives at least once, and any second copy is
  flagged.
- **a stalled producer**: messages outstanding and no delivery reported for :data:`STALL_S` seconds is
  treated like an unusable producer (rebuilt, resent). Measured against the embedded broker restarted under
  a running trainer (it loses every producer id): librdkafka's idempotent producer bumps its epoch, gets
  ``UNKNOWN_PRODUCER_ID`` again, and loops without ever reporting an error (tests/reliability/
  test_trainer_faults.py); a new producer gets a new id and delivers at once.

Not thread-safe: the loop thread sends and polls (librdkafka calls the callbacks from ``poll``/``flush``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException, Message

from ferret_core.errors import FerretError

log = logging.getLogger("ferret.trainer")

QUEUE_FULL_WAIT_S = 10.0
STALL_S = 15.0  # outstanding messages and no delivery report for this long: the producer is rebuilt
# A dead producer's purge reports come from its broker threads: waited for this long (what none reports is
# resent flagged, as a copy of it may be on the topic). Measured: without the wait, a non-blocking purge
# reported none of 17 messages before the next poll, and all 17 went out flagged.
PURGE_WAIT_S = 1.0
Delivered = Callable[[KafkaError | None, Message | None], None]
Headers = list[tuple[str, bytes]]
# Codes after which an idempotent producer sends nothing more; librdkafka raises them as fatal errors, but
# the delivery reports of the refused batch and the later produce() calls carry them with fatal() False.
UNUSABLE = frozenset(
    {
        KafkaError._FATAL,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.PRODUCER_FENCED,
    }
)
# Failed messages that are certainly not on the topic: never sent (purged from the queue), or refused by the
# broker for the producer's state. Any other failure of a dying producer may have left a copy there.
REFUSED = frozenset(
    {
        KafkaError._PURGE_QUEUE,
        KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER,
        KafkaError.INVALID_PRODUCER_EPOCH,
        KafkaError.INVALID_PRODUCER_ID_MAPPING,
        KafkaError.PRODUCER_FENCED,
    }
)


class ProducerLike(Protocol):
    """What the publisher uses of ``confluent_kafka.Producer`` (tests pass fakes)."""

    def produce(self, topic: str, value: bytes | None = ..., key: bytes | None = ..., **kwargs: object) -> None: ...

    def poll(self, timeout: float = ...) -> int: ...

    def flush(self, timeout: float = ...) -> int: ...

    def purge(self, in_queue: bool = ..., in_flight: bool = ..., blocking: bool = ...) -> None: ...


class MessageTooLarge(FerretError, ValueError):
    """The producer refused a message for its size (its ``message.max.bytes``)."""


@dataclass(frozen=True, slots=True)
class Reissue:
    """The same outcome flagged as a duplicate (its value, headers and delivery callback): what a rebuilt
    producer sends in place of a message whose first copy may already be on the topic."""

    value: bytes | None
    headers: Headers | None
    on_delivery: Delivered


Flagged = Callable[[], Reissue]


@dataclass(frozen=True, slots=True)
class _Outgoing:
    topic: str
    value: bytes | None
    key: bytes | None
    headers: Headers | None
    partition: int | None
    on_delivery: Delivered
    flagged: Flagged | None = None  # the flagged copy, made only if it is resent after a rebuild
    duplicate: bool = False  # this is the flagged copy

    def as_duplicate(self) -> _Outgoing:
        """This message as its flagged copy (itself when its sender gave none)."""
        if self.flagged is None:
            return self
        copy = self.flagged()
        return replace(self, value=copy.value, headers=copy.headers, on_delivery=copy.on_delivery, flagged=None,
                       duplicate=True)  # fmt: skip


def too_large(error: KafkaError | None) -> bool:
    return error is not None and error.code() == KafkaError.MSG_SIZE_TOO_LARGE


def unusable(error: KafkaError | None) -> bool:
    """Whether ``error`` means the producer can send nothing more (module docstring): fatal, or one of
    :data:`UNUSABLE` (as the delivery reports and ``produce()`` carry them, with ``fatal()`` False)."""
    return error is not None and (error.fatal() or error.code() in UNUSABLE)


def _error_of(exc: KafkaException) -> KafkaError | None:
    error = exc.args[0] if exc.args else None
    return error if isinstance(error, KafkaError) else None


class Publisher:
    """Sends through a producer from ``make(error_cb)`` and rebuilds it when it becomes unusable."""

    def __init__(
        self, make: Callable[[Callable[[KafkaError], None]], ProducerLike], stall_s: float | None = None
    ) -> None:
        self._make = make
        self.stall_s = STALL_S if stall_s is None else stall_s
        self._progress_at = time.monotonic()  # the last delivery report, or the first send after none was due
        self._fatal: KafkaError | None = None
        self._producer = make(self._on_error)
        self._outgoing: dict[int, _Outgoing] = {}  # sent, delivery not reported yet (by sequence)
        # lost with a dead producer, to send again: (sequence, message, whether a copy may be on the topic)
        self._resend: list[tuple[int, _Outgoing, bool]] = []
        self._sequence = 0
        self._tearing_down = False
        self.rebuilds = 0
        self.resent = 0  # messages sent again on a rebuilt producer
        self.resent_flagged = 0  # of those, sent as their flagged copy

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
        flagged: Flagged | None = None,
    ) -> None:
        """Queue one message; ``on_delivery(error, message)`` runs from a later :meth:`poll`/:meth:`flush`.
        ``flagged`` makes the message's flagged copy (:class:`Reissue`), sent instead of it if a rebuilt
        producer resends it while a first copy may be on the topic. Raises :class:`MessageTooLarge`, or
        ``KafkaException`` / ``BufferError`` when the producer still refuses after its rebuild or
        :data:`QUEUE_FULL_WAIT_S` of polling."""
        self._sequence += 1
        self._send(self._sequence, _Outgoing(topic, value, key, headers, partition, on_delivery, flagged))

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
                self._serve(0.05)
                self._recover()
            except KafkaException as exc:
                error = _error_of(exc)
                if too_large(error):
                    raise MessageTooLarge(f"{out.topic}: {error.str() if error else exc}") from exc
                if not unusable(error):
                    raise
                self._fatal = self._fatal or error  # produce() says _FATAL (fatal() False) once it died
                self._recover()
                self._produce(sequence, out)  # once more on the new producer; raises if that fails too
                return

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
        if unusable(error):
            self._fatal = self._fatal or error
        if error is not None and (self._fatal is not None or self._tearing_down):
            # the producer died under it: send it on the next one, flagged where a copy may be on the topic
            self._resend.append((sequence, out, error.code() not in REFUSED))
            return
        out.on_delivery(error, message)

    # -- serving deliveries ------------------------------------------------------------------------------
    def poll(self, timeout: float = 0.0) -> int:
        served = self._serve(timeout)
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
        left = self._flush(timeout)
        while self._fatal is not None or self._resend:
            self._recover()
            left = self._flush(max(0.0, deadline - time.monotonic()))
            if time.monotonic() >= deadline:
                break
        return left + len(self._resend)

    def _serve(self, timeout: float) -> int:
        """The producer's ``poll``; the fatal error confluent-kafka raises from it marks it for rebuilding."""
        try:
            return int(self._producer.poll(timeout))
        except KafkaException as exc:
            self._died(exc)
            return 0

    def _flush(self, timeout: float) -> int:
        try:
            return int(self._producer.flush(timeout))
        except KafkaException as exc:
            self._died(exc)
            return len(self._outgoing)

    def _died(self, exc: KafkaException) -> None:
        """``exc`` (raised by ``poll``/``flush``) if the producer is still usable, else note its death."""
        error = _error_of(exc)
        if not unusable(error):
            raise exc
        self._fatal = self._fatal or error

    # -- rebuilding ---------------------------------------------------------------------------------------
    def _on_error(self, error: KafkaError) -> None:
        """librdkafka's ``error_cb``: a fatal error means this producer can send nothing more."""
        if unusable(error):
            self._fatal = self._fatal or error
        else:
            log.warning("producer: %s", error.str())

    def _purge(self, old: ProducerLike) -> None:
        """Take back what the dead producer holds: its purge reports (served by ``poll``, for up to
        :data:`PURGE_WAIT_S`) move each message to the resend list, flagged or not by its code."""
        try:
            old.purge(in_queue=True, in_flight=True, blocking=False)
        except (KafkaException, RuntimeError) as exc:
            log.warning("producer: purging the failed producer: %s", exc)
        deadline = time.monotonic() + PURGE_WAIT_S
        while self._outgoing and time.monotonic() < deadline:
            try:
                old.poll(0.05)
            except (KafkaException, RuntimeError) as exc:  # its fatal error, raised again
                log.debug("producer: polling the failed producer: %s", exc)

    def _recover(self) -> None:
        """After the producer became unusable: collect what it still held, build a new one, resend."""
        if self._fatal is None and not self._resend:
            return
        if self._fatal is not None:
            error = self._fatal
            old = self._producer
            self._tearing_down = True
            try:
                self._purge(old)
            finally:
                self._tearing_down = False
            self._fatal = None
            self._resend.extend((s, out, True) for s, out in self._outgoing.items())  # never reported: unknown
            self._outgoing.clear()
            self._producer = self._make(self._on_error)
            self._progress_at = time.monotonic()
            self.rebuilds += 1
            flagged = sum(written for _, _, written in self._resend)
            log.error("producer unusable (%s: %s): rebuilt; resending %d messages, %d as flagged duplicates "
                      "(a first copy may be on the topic)", error.name(), error.str(), len(self._resend),
                      flagged)  # fmt: skip
        resend, self._resend = sorted(self._resend, key=lambda entry: entry[0]), []
        for index, (sequence, out, written) in enumerate(resend):
            again = out.as_duplicate() if written else out
            try:
                self._produce(sequence, again)
            except BufferError:  # the next poll goes on from here, in order
                self._resend = [(sequence, again, False), *resend[index + 1 :]]
                self._serve(0.05)
                return
            except KafkaException as exc:
                failure = _error_of(exc)
                if unusable(failure):  # the new producer died too: the next poll rebuilds again
                    self._fatal = failure
                    self._resend = [(sequence, again, False), *resend[index + 1 :]]
                    return
                again.on_delivery(failure or KafkaError(KafkaError._FAIL, str(exc)), None)
                continue
            self.resent += 1
            self.resent_flagged += int(again.duplicate)
