"""Snapshot writes to Redis off the record path (docs/reliability.md, "frozen Redis").

The loop thread drains, flushes and serialises a snapshot (``SnapshotStore.prepare``: bytes the write owns,
so training may go on), then hands the Redis write to a :class:`WriteQueue` and goes back to the stream. A
write that hangs (a SIGSTOPped or overloaded Redis) ends with the store's error after ``redis.timeout_s``
per command; meanwhile :func:`stuck_after` lets health say so once it has hung ``redis.stall_s``. Measured
before (issue 26): the write and the reconnect ping ran on the loop, so a frozen Redis held every prediction
for the socket timeout (3 s in the test, 5 s by default, twice in a row: ~10 s), and readiness, guarded
with a deadline equal to that timeout, never went NOT_SERVING.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class WriteQueue:
    """Runs jobs one after another in the order given, each on a short-lived daemon thread: no thread
    exists while idle, and a job stuck on a frozen Redis never holds up the process's exit."""

    def __init__(self, name: str = "ferret-snapshot-write") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._last: Future[Any] | None = None

    def submit(self, job: Callable[[], T]) -> Future[T]:
        """``job`` after every job submitted before it; its result (or error) in the future."""
        future: Future[T] = Future()
        with self._lock:
            previous, self._last = self._last, future

        def run() -> None:
            if previous is not None:
                futures.wait([previous])
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(job())
            except BaseException as exc:  # handed to whoever waits for the future
                future.set_exception(exc)

        threading.Thread(target=run, name=self._name, daemon=True).start()
        return future

    @property
    def busy(self) -> bool:
        """Whether a job is queued or running."""
        with self._lock:
            return self._last is not None and not self._last.done()


@contextlib.contextmanager
def stuck_after(seconds: float, on_stuck: Callable[[], None]) -> Iterator[None]:
    """Call ``on_stuck`` once if the block still runs after ``seconds``; never once the block has ended
    (so whatever the caller reports after the block is the last word)."""
    lock = threading.Lock()
    ended = False

    def fire() -> None:
        with lock:
            if not ended:
                on_stuck()

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        with lock:
            ended = True
