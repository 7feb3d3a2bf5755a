"""The process clock's executor processes: their pipes and processes, and the clock's first failure.

:class:`ExecutorPool` holds, under one condition (``cv``, the clock's lock), every live executor's pipe
and process, local (:func:`~ferret_core.engine.processes.executor.start_executor`) or on another host
(:class:`~ferret_core.engine.processes.hosts.RemoteConnection`, ``RemoteProcess``), the executors a
re-plan retires and the pipes left to close. The first failure is kept here because failing kills the
processes: an executor's error, a dead pipe found by a send (:class:`~ferret_core.errors.ExecutorLost`)
or a process the router saw exit stops every executor, and is raised in the caller by the clock's next
call (:meth:`ExecutorPool.raise_if_failed`).
"""

from __future__ import annotations

import contextlib
import multiprocessing.connection as mpc
import threading
from typing import Any

from ferret_core.engine.processes.dispatch import Executor
from ferret_core.engine.processes.executor import stop_executors
from ferret_core.errors import ExecutorLost

JOIN_TIMEOUT_S = 5.0  # a closed executor that has not exited by then is killed


class ExecutorPool:
    """The executors' pipes and processes, which of them are retiring, and the clock's first failure,
    read and written under ``cv``."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.error: BaseException | None = None
        self.stopping = False
        self.failed_item: int | None = None  # the item an executor's error named, if any
        self.conns: dict[Executor, mpc.Connection] = {}
        self.processes: dict[Executor, Any] = {}
        self.retiring: set[Executor] = set()  # executors a re-plan removed, exiting on purpose
        self.dead_conns: list[mpc.Connection] = []  # retired executors' pipes, closed by the router

    def add(self, executor: Executor, conn: Any, process: Any) -> None:
        """Keep a started executor's pipe (or a remote host's stand-in for it) and process."""
        self.conns[executor] = conn
        self.processes[executor] = process

    def send(self, executor: Executor, message: Any) -> None:
        """Send ``message`` to ``executor``'s pipe; call under the lock. An executor killed since the router
        last looked (its sentinel not yet seen) is the same loss, found by the send: :class:`ExecutorLost`
        fails the clock and is raised, whichever message found it (an action, a question, a re-plan's)."""
        try:
            self.conns[executor].send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            self.raise_if_failed()  # the clock already failed (and ended the others): its first exception
            worker, stage = executor
            kind = message[0] if isinstance(message, tuple) and message else type(message).__name__
            lost = ExecutorLost(
                f"executor process of worker {worker}, stage {stage} is gone: sending it {kind!r} failed "
                f"({type(exc).__name__}: {exc})"
            )
            self.fail_locked(lost)
            raise lost from exc

    def fail(self, exc: BaseException) -> None:
        """Record an executor's death, unless the clock is closing (then executors exit on purpose)."""
        with self.cv:
            if not self.stopping:
                self.fail_locked(exc)

    def fail_locked(self, exc: BaseException) -> None:
        """Keep the first failure, wake every waiter and kill every executor; call under the lock."""
        if self.error is None:
            self.error = exc
        self.cv.notify_all()
        for process in self.processes.values():
            if process.is_alive():
                process.kill()

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    # ------------------------------------------------------------------------------------ retiring
    def retire(self, executor: Executor) -> None:
        """Tell ``executor`` to exit on purpose (a re-plan removed its worker); call under the lock."""
        self.retiring.add(executor)
        self.send(executor, ("retire",))

    def join_retired(self, executor: Executor) -> None:
        """Wait for a retired executor to exit (killed after :data:`JOIN_TIMEOUT_S`), then forget it."""
        process = self.processes[executor]
        process.join(JOIN_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
        self.forget(executor)

    def forget(self, executor: Executor) -> None:
        """Drop a retired executor's pipe and process (whichever of the re-plan and the router sees its
        exit first)."""
        with self.cv:
            if executor in self.retiring:
                self.retiring.discard(executor)
                self.dead_conns.append(self.conns.pop(executor))  # the router closes it (it may be reading it)
                self.processes.pop(executor)

    def close_dead(self) -> None:
        """Close the retired executors' pipes (no wait reads them any more)."""
        for dead in self.dead_conns:
            dead.close()
        self.dead_conns.clear()

    # ------------------------------------------------------------------------------------ stopping
    def begin_stop(self) -> None:
        """Mark the clock stopping and send every executor its last message (None: exit)."""
        with self.cv:  # no action is sent after this, so the None below is each pipe's last message
            self.stopping = True
            self.cv.notify_all()
            for conn in self.conns.values():
                with contextlib.suppress(OSError, EOFError):
                    conn.send(None)

    def stop(self) -> None:
        """Wait for every executor to exit (killing those still alive after :data:`JOIN_TIMEOUT_S`) and
        close their pipes."""
        stop_executors(self.processes.values(), self.conns.values(), JOIN_TIMEOUT_S)
