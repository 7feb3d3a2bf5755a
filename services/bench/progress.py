"""A progress line for the bench: runs done of the total, elapsed time and the time left (the mean time
per finished run times the runs left, divided by the parallel jobs' actual throughput)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class Progress:
    def __init__(self, total: int, *, label: str, stream: TextIO | None = None) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.failed = 0
        self._stream = stream if stream is not None else sys.stderr
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._tty = self._stream.isatty()

    def advance(self, *, failed: bool = False, what: str = "") -> None:
        with self._lock:
            self.done += 1
            self.failed += int(failed)
            self._stream.write(self.line(what) + ("\r" if self._tty and self.done < self.total else "\n"))
            self._stream.flush()

    def line(self, what: str = "") -> str:
        elapsed = time.monotonic() - self._start
        left = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        failed = f", {self.failed} failed" if self.failed else ""
        tail = f"  {what}" if what and not self._tty else ""
        return (
            f"{self.label}: {self.done}/{self.total} runs{failed}, {_clock(elapsed)} elapsed, {_clock(left)} left{tail}"
        )


def _clock(seconds: float) -> str:
    if seconds != seconds:  # nan: nothing finished yet
        return "?"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
