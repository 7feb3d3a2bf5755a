"""The process clock's router: one thread that reads the executors' answers and sends their next actions.

The router waits on every executor's pipe, on every executor process's sentinel and on its own wake-up
pipe (:meth:`Router.wake`: stop, or a re-plan changed the executors). An executor's answer is recorded
by :class:`~ferret_core.engine.processes.dispatch.Dispatch` as the trace events the validator reads, and
the executors it freed are sent their next actions (:meth:`Router.kick`). A sentinel that becomes ready
is an executor that exited: on purpose if a re-plan retired it, else a loss that fails the clock
(:class:`~ferret_core.errors.ExecutorLost`) after its last words (an error it sent before exiting) are
read. A failure in the router itself also fails the clock instead of leaving the caller waiting.
"""

from __future__ import annotations

import multiprocessing.connection as mpc
import threading
from typing import Any

from ferret_core.engine.processes.dispatch import Dispatch, Executor
from ferret_core.engine.processes.pool import ExecutorPool
from ferret_core.engine.processes.reports import ClockReports
from ferret_core.errors import ExecutorLost, ScheduleError

# What gloo says when the peer of a point-to-point send or receive is gone (a killed process, a lost host)
PEER_LOST = ("reset by peer", "closed by peer", "Broken pipe", "Connection refused", "Socket closed")


def lost_neighbour(text: str) -> bool:
    """Whether an executor's failure is its gloo connection to a neighbouring stage failing (that executor
    died): an :class:`ExecutorLost`, not an item's failure, whichever of the two the router hears first."""
    return any(sign in text for sign in PEER_LOST)


class Router:
    """The router thread over ``pool``'s executors: their answers into ``dispatch`` and ``reports``, their
    next actions out (see the module docstring)."""

    def __init__(self, pool: ExecutorPool, dispatch: Dispatch, reports: ClockReports) -> None:
        self._pool = pool
        self._dispatch = dispatch
        self._reports = reports
        self._thread: threading.Thread | None = None
        self._wake_r: Any = None  # the router's wake-up pipe (start() makes it)
        self._wake_w: Any = None

    def start(self) -> None:
        self._wake_r, self._wake_w = mpc.Pipe(duplex=False)
        self._thread = threading.Thread(target=self._route, name="ferret-router", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Make the router look at the executors again (a re-plan started or retired some)."""
        self._wake_w.send("refresh")

    def stop(self) -> None:
        """Wake the router to end (the pool is stopping), wait for it, and close its wake-up pipe."""
        if self._thread is not None:
            self._wake_w.send(None)
            self._thread.join()
            self._thread = None
            self._wake_r.close()
            self._wake_w.close()

    def kick(self, worker: int, stage: int) -> None:
        """Send executor (worker, stage) its next action, if it has one; call under the lock."""
        pool = self._pool
        if pool.error is not None or pool.stopping:
            return
        message = self._dispatch.next_message(worker, stage)
        if message is None:
            return
        pool.send((worker, stage), message)

    def _route(self) -> None:
        """The router thread: executors' answers in, next actions out, failures stop everything (its own
        included: a broken invariant here fails the clock instead of leaving the caller waiting)."""
        try:
            self._route_until_stopped()
        except BaseException as exc:
            self._pool.fail(exc)

    def _route_until_stopped(self) -> None:
        pool = self._pool
        while True:
            with pool.cv:
                pool.close_dead()  # not in the previous wait any more: safe to close
                if pool.stopping or pool.error is not None:
                    return
                by_conn = {conn: e for e, conn in pool.conns.items()}
                by_sentinel = {pool.processes[e].sentinel: e for e in pool.conns}
            waits: list[Any] = [self._wake_r, *by_conn, *by_sentinel]
            ready: Any
            for ready in mpc.wait(waits):
                if ready is self._wake_r:
                    wake: Any = self._wake_r
                    wake.recv()
                    break  # stop, or a re-plan changed the executors: look again
                if ready in by_sentinel:
                    e = by_sentinel[ready]
                    with pool.cv:
                        current = pool.processes.get(e)
                        stale = current is None or current.sentinel != ready  # forgotten, or started anew
                        retiring = e in pool.retiring
                    if stale:
                        continue
                    if retiring:  # a re-plan removed it: it exited on purpose
                        pool.forget(e)
                        break
                    conn = pool.conns[e]
                    while conn.poll():  # its last words first (an error it sent before exiting)
                        self._handle(e, conn.recv())
                    pool.fail(
                        ExecutorLost(
                            f"executor process of worker {e[0]}, stage {e[1]} (pid {pool.processes[e].pid}) exited "
                            f"with code {pool.processes[e].exitcode} while the clock ran"
                        )
                    )
                    return
                e = by_conn[ready]
                conn = ready
                with pool.cv:
                    if pool.conns.get(e) is not conn:  # retired since the wait began
                        continue
                try:
                    message = conn.recv()
                except (EOFError, OSError):
                    if e in pool.retiring or e not in pool.conns:
                        break  # a retired executor's pipe: look again
                    pool.fail(ExecutorLost(f"executor process of worker {e[0]}, stage {e[1]} closed its pipe"))
                    return
                self._handle(e, message)

    def _handle(self, executor: Executor, message: tuple[Any, ...]) -> None:
        """One answer from ``executor``: a finished action (its freed executors kicked), an answer to a
        question, or its error (which fails the clock)."""
        n, j = executor
        kind = message[0]
        pool = self._pool
        with pool.cv:
            if kind in ("FB", "F", "B"):
                *report, peak = message  # every answer ends with the executor's measured peak
                message = tuple(report)
                self._reports.record_peak(executor, peak)
                if kind == "FB":
                    changed = self._dispatch.forward_done(n, j, message[1], then_backward=True)
                    changed += self._dispatch.backward_done(n, j, message[2])
                elif kind == "F":
                    changed = self._dispatch.forward_done(n, j, message, then_backward=False)
                else:
                    changed = self._dispatch.backward_done(n, j, message)
                for e in changed:
                    self.kick(*e)
                pool.cv.notify_all()
            elif kind in ("stats", "compensation"):  # an answer to ClockReports.ask
                self._reports.answer(executor, message)
            elif kind == "error":
                _, item, text, tb = message
                if lost_neighbour(text):  # a neighbouring stage's executor died: no item is to blame
                    pool.fail_locked(
                        ExecutorLost(
                            f"executor of worker {n}, stage {j} lost the executor of a neighbouring stage (its "
                            f"gloo connection failed during item {item}): {text}"
                        )
                    )
                    return
                if pool.failed_item is None:
                    pool.failed_item = item
                pool.fail_locked(
                    ScheduleError(f"executor of worker {n}, stage {j} failed on item {item}: {text}\n{tb}")
                )
            else:
                pool.fail_locked(ScheduleError(f"executor of worker {n}, stage {j} sent an unknown message {kind!r}"))
