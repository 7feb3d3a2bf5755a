"""Reaching Redis: a client with timeouts, and the degraded mode while it is down.

A trainer must start and stream while Redis is down, and a frozen Redis must not stall it for long:

    client = redis_client(settings.redis.url, socket_timeout_s=5)    # every command bounded
    store = SnapshotStore(client, ns, instance)
    link = Reconnect(store.ping, on_change=health.set_snapshots_ok)  # ferret.snapshots health name
    if link.check():                                   # first attempt now; False: start fresh, degraded
        choice = store.newest_compatible(fingerprint)
    ...
    link.check()          # in the loop: cheap while up; while down it pings only when a retry is due
    link.failed(exc)      # after a SnapshotUnavailableError: degraded again, next retry after a backoff

Retries back off exponentially (``initial_s`` doubling up to ``max_s``, with jitter) so a long outage
costs one PING per ``max_s``. A save that was due while Redis was down is simply the next one after it
answers again (the trainer keeps its interval).

Unreachable is not misconfigured: a Redis that answers but refuses the credentials (a wrong password in
``redis.url``) at the first check raises :class:`SnapshotAuthError` from :meth:`Reconnect.check`, so the
trainer fails at start with the fix rather than running for good without snapshots; ``optional=True``
(``redis.optional``) degrades instead, with the error logged. After the first check a refusal degrades
like an outage (a password rotated under a running trainer must not stop its predictions).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ferret_core.errors import ConfigError
from services.snapshots.errors import SnapshotAuthError, SnapshotError, SnapshotUnavailableError

log = logging.getLogger(__name__)

DEFAULT_SOCKET_TIMEOUT_S = 5.0
DEFAULT_CONNECT_TIMEOUT_S = 2.0


def redacted_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and logs)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def redis_client(
    url: str,
    *,
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
) -> redis.Redis:
    """A bytes client for the snapshot store whose every command fails after ``socket_timeout_s``
    (SIGSTOPped or overloaded Redis) and every connect after ``connect_timeout_s``, with no silent
    retries (the store reports, the trainer decides). Raises ``ConfigError`` for a malformed URL,
    without its password."""
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
        )
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"redis.url: cannot use {redacted_url(url)!r}: {exc}") from None


@dataclass(frozen=True)
class Backoff:
    """Delays between retries: ``initial_s``·``factor``^k, capped at ``max_s``, ±``jitter`` (fraction)."""

    initial_s: float = 0.5
    max_s: float = 30.0
    factor: float = 2.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if not (0 < self.initial_s <= self.max_s and self.factor >= 1 and 0 <= self.jitter < 1):
            raise ConfigError(f"need 0 < initial_s <= max_s, factor >= 1, 0 <= jitter < 1; got {self}")

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        rng = rng or random.Random()
        delay = self.initial_s
        while True:
            yield delay * (1 + rng.uniform(-self.jitter, self.jitter))
            delay = min(self.max_s, delay * self.factor)


class Reconnect:
    """Whether Redis answers, retried with :class:`Backoff` while it does not (module docstring).

    ``ping`` raises (any :class:`SnapshotError`, or a Redis error) when Redis does not answer;
    ``on_change(available)`` is called on every change (e.g. ``ControlHealth.set_snapshots_ok``).
    ``optional``: credentials refused at the first check degrade instead of raising (module docstring).
    Thread-safe; ``clock`` is monotonic seconds.
    """

    def __init__(
        self,
        ping: Callable[[], object],
        *,
        backoff: Backoff | None = None,
        on_change: Callable[[bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        optional: bool = False,
    ) -> None:
        self._ping = ping
        self._optional = optional
        self._backoff = backoff or Backoff()
        self._on_change = on_change or (lambda available: None)
        self._clock = clock
        self._rng = rng
        self._lock = threading.Lock()
        self._available: bool | None = None  # unknown until the first check
        self._delays: Iterator[float] = self._backoff.delays(rng)
        self._retry_at = clock()
        self.attempts = 0
        self.last_error = ""

    @property
    def available(self) -> bool:
        with self._lock:
            return bool(self._available)

    def next_retry_in(self) -> float:
        """Seconds until the next ping is due (0 when up or due now)."""
        with self._lock:
            return 0.0 if self._available else max(0.0, self._retry_at - self._clock())

    def check(self) -> bool:
        """True when Redis is known up; while down, ping if a retry is due (else just False). Raises
        :class:`SnapshotAuthError` when the first check finds the credentials refused, unless optional."""
        with self._lock:
            if self._available:
                return True
            if self._available is not None and self._clock() < self._retry_at:
                return False
            self.attempts += 1
            first = self._available is None
        try:
            self._ping()
        except (SnapshotError, redis.RedisError, OSError) as exc:
            if first and not self._optional:
                _raise_if_refused(exc)
            self.failed(exc)
            return False
        self._set(True, "")
        return True

    def failed(self, exc: BaseException) -> None:
        """An operation found Redis unavailable: degraded until the next retry answers."""
        with self._lock:
            self._retry_at = self._clock() + next(self._delays)
        self._set(False, str(exc))

    def _set(self, available: bool, error: str) -> None:
        with self._lock:
            changed = self._available is not available
            self._available = available
            self.last_error = error
            if available:
                self._delays = self._backoff.delays(self._rng)
            retry_in = max(0.0, self._retry_at - self._clock())
        if not changed:
            return
        if available:
            log.info("snapshot store: Redis answers again")
        else:
            log.error("snapshot store degraded (snapshots off), retrying in %.1f s: %s", retry_in, error)
        self._on_change(available)


def _raise_if_refused(exc: BaseException) -> None:
    """Re-raise ``exc`` as :class:`SnapshotAuthError` when Redis refused the credentials."""
    if isinstance(exc, SnapshotAuthError):
        raise exc
    if isinstance(exc, redis.AuthenticationError):
        raise SnapshotAuthError(
            f"Redis refused the credentials ({exc}); expected the password (and user) the server is "
            "configured with in redis.url, or set redis.optional: true to start without snapshots"
        ) from exc


__all__ = ["Backoff", "Reconnect", "SnapshotUnavailableError", "redacted_url", "redis_client"]
