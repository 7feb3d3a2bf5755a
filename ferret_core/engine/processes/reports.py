"""What the process clock's executors report: their memory peaks, and the answers to the clock's questions.

Every answer an executor sends ends with the peak of the tensors it held in its own process
(:mod:`.executor`); :class:`ClockReports` keeps the largest per executor, also for those a re-plan
retired (a peak over the clock's life). :meth:`ClockReports.ask` sends every executor one question
(``"stats"``, ``"compensation"``) and waits for the router to store each answer; :meth:`usage` and
:meth:`compensations` read them. :meth:`measured_bytes` is the shared segments (counted once, by the
clock) plus the executors' peaks.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import torch

from ferret_core.engine.processes.dispatch import Executor
from ferret_core.engine.processes.pool import ExecutorPool
from ferret_core.engine.processes.settings import CompensationReport, ProcessUsage
from ferret_core.errors import ScheduleError


class ClockReports:
    """The executors' measured peaks and their answers to the last question, under the pool's lock.
    ``shared_bytes``: the clock's shared segments (version slots, delta rings, average steps), counted once."""

    def __init__(self, pool: ExecutorPool, shared_bytes: Callable[[], int]) -> None:
        self._pool = pool
        self._shared_bytes = shared_bytes
        self._replies: dict[Executor, tuple[Any, ...]] = {}  # answers to the last ask
        # per executor, the peak of what it held in its process (shared segments excluded), as its answers
        # report it; kept for executors a re-plan retired (a peak over the clock's life)
        self._peaks: dict[Executor, int] = {}

    def record_peak(self, executor: Executor, peak: int) -> None:
        """Keep ``executor``'s measured peak if it is its largest yet; call under the lock."""
        if peak > self._peaks.get(executor, 0):
            self._peaks[executor] = peak

    def answer(self, executor: Executor, message: tuple[Any, ...]) -> None:
        """Store ``executor``'s answer to the last :meth:`ask` and wake the asker; call under the lock."""
        self._replies[executor] = message
        self._pool.cv.notify_all()

    def ask(self, kind: str, timeout: float) -> dict[Executor, tuple[Any, ...]]:
        """Send ``(kind,)`` to every executor and wait for each one's answer (the router stores them)."""
        pool = self._pool
        with pool.cv:
            pool.raise_if_failed()
            self._replies.clear()
            for executor in list(pool.conns):
                pool.send(executor, (kind,))
            deadline = time.perf_counter() + timeout
            while len(self._replies) < len(pool.conns) and pool.error is None:
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise ScheduleError(f"executors did not answer {kind!r} within {timeout} s")
                pool.cv.wait(left)
            pool.raise_if_failed()
            return dict(self._replies)

    def usage(self, timeout: float) -> list[ProcessUsage]:
        """CPU seconds, peak RSS and measured memory of every executor process (asked over their pipes;
        call drained)."""
        replies = self.ask("stats", timeout)
        usages = []
        for (n, j), (_, cpu, rss, memory, heap_retained) in sorted(replies.items()):
            usages.append(
                ProcessUsage(
                    n,
                    j,
                    self._pool.processes[(n, j)].pid,
                    cpu,
                    rss,
                    measured_bytes=memory["peak_bytes"],
                    measured_breakdown=memory["peak_breakdown"],
                    memory_samples=memory["samples"],
                    sample_seconds=memory["sample_seconds"],
                    actions=memory["actions"],
                    heap_retained=heap_retained,
                )
            )
        with self._pool.cv:
            for u in usages:
                key = (u.worker, u.stage)
                self._peaks[key] = max(self._peaks.get(key, 0), u.measured_bytes)
        return usages

    def compensations(self, timeout: float) -> list[CompensationReport]:
        """Every executor's compensator stats and recorded calls (``ProcessSettings.record_compensations``),
        asked over their pipes; call drained."""
        replies = self.ask("compensation", timeout)
        return [
            CompensationReport(n, j, stats, torch.load(io.BytesIO(payload), weights_only=True))
            for (n, j), (_, stats, payload) in sorted(replies.items())
        ]

    def executor_bytes(self) -> dict[Executor, int]:
        """Per executor (worker, stage), the peak bytes it measured in its own process so far (the tensors
        it held at a sample after an action, the shared segments excluded), as its last answer reported."""
        with self._pool.cv:
            return dict(self._peaks)

    def measured_bytes(self) -> int:
        """The plan's measured peak: the shared bytes (version slots, delta rings, average steps; once) plus
        the sum of every executor's peak (:meth:`executor_bytes`). The executors reach their peaks at
        different moments, so the sum is an upper bound of the bytes all of them held at once (and of the
        simultaneous total over every sample); the coordinator's own tensors (arrivals waiting to be sent,
        a prediction's activations) are not measured here."""
        with self._pool.cv:
            return self._shared_bytes() + sum(self._peaks.values())
