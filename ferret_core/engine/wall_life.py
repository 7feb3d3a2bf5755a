"""The wall clock's life cycle: its threads, the flag that stops them and the first failure of any.

The first exception raised in a thread (an executor, the prediction thread) or in a caller that runs the
executors' actions itself (inline training) is kept, stops every thread, and is re-raised in the caller
by the next :meth:`~ferret_core.engine.wall_clock.WallClock.submit`, ``drain`` or ``close`` (as
torchgpipe's workers do). The condition is over the pipeline's lock: whoever waits for the pipeline (an
idle executor, a drain) waits on it, and whatever changes the pipeline's state notifies it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ferret_core.errors import FerretError


class ClockStopped(FerretError, RuntimeError):
    """The wall clock was closed or failed before the call."""


class WallStamps:
    """Trace times read from the wall clock, in seconds since the clock started (``origin``, a
    ``perf_counter`` value)."""

    def __init__(self, origin: float) -> None:
        self.origin = origin

    def start(self) -> float:
        return time.perf_counter() - self.origin

    def split(self) -> float:
        return time.perf_counter() - self.origin

    def end(self) -> float:
        return time.perf_counter() - self.origin


class ClockLife:
    """The clock's threads, whether it is started or stopping, and the first failure, under ``cv`` (a
    condition over the pipeline's ``lock``)."""

    def __init__(self, lock: threading.Lock | threading.RLock) -> None:
        self.cv = threading.Condition(lock)
        self.error: BaseException | None = None
        self.stopping = False
        self.started = False
        self.threads: list[threading.Thread] = []

    def spawn(self, name: str, target: Callable[..., None], *args: int) -> None:
        """Start a daemon thread running ``target(*args)``; its failure is kept (:meth:`record_failure`)."""
        thread = threading.Thread(target=self._guard, args=(target, *args), name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _guard(self, target: Callable[..., None], *args: int) -> None:
        try:
            target(*args)
        except BaseException as exc:  # re-raised in the caller
            self.record_failure(exc)

    def record_failure(self, exc: BaseException) -> None:
        """Keep the first failure (re-raised in the caller) and stop every thread."""
        with self.cv:
            if self.error is None:
                self.error = exc
            self.stopping = True
            self.cv.notify_all()

    def stop(self) -> None:
        """Tell every thread to stop (each ends at its next look at the flag)."""
        with self.cv:
            self.stopping = True
            self.cv.notify_all()

    def join(self) -> None:
        """Wait for every thread to end; the clock is no longer started."""
        for thread in self.threads:
            thread.join()
        self.threads = []
        self.started = False

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
