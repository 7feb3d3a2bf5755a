"""Control-plane work run on the loop thread: re-plans, snapshots and restores touch the learner and the
Kafka clients, which only the loop thread uses. A gRPC thread hands a function to :meth:`LoopCalls.call`
and waits; the record path runs the queued calls between batches (:meth:`LoopCalls.serve`), with
consumption paused (counted); once the loop ends, :meth:`LoopCalls.close` fails what is queued and
refuses new calls (UNAVAILABLE). A call whose caller's deadline passed while it waited for the loop's turn
is not run (``DeadlineExpired``, DEADLINE_EXCEEDED)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, TypeVar

from services.control.deadline import CallDeadline
from services.control.errors import ServiceUnavailable

T = TypeVar("T")


class LoopCalls:
    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[_Queued] = queue.SimpleQueue()
        self._loop: threading.Thread | None = None
        self._closed = False
        self._lock = threading.Lock()

    def bind(self) -> None:
        """Called by the loop thread when it starts: from now on calls run there."""
        self._loop = threading.current_thread()

    def call(self, fn: Callable[[], T], *, deadline: CallDeadline | None = None, what: str = "the request") -> T:
        """Run ``fn`` on the loop thread and return its result (or raise its error). Before the loop starts
        (start-up restore) and on the loop thread itself, ``fn`` runs at once. ``deadline``: the caller's;
        when it has passed by the loop's turn, ``fn`` is not run and ``DeadlineExpired`` (naming ``what``)
        is raised."""
        with self._lock:
            if self._closed:
                raise ServiceUnavailable("the trainer is stopping; the request was not run")
            if self._loop is None or threading.current_thread() is self._loop:
                direct = True
            else:
                direct = False
                future: Future[T] = Future()
                self._requests.put(_Queued(fn, future, deadline, what))
        if direct:
            if deadline is not None:
                deadline.check(what)
            return fn()
        return future.result()

    def serve(self, paused: Callable[[], AbstractContextManager[None]]) -> None:
        """Run every queued call, each inside ``paused()`` (consumption paused for its duration)."""
        while True:
            try:
                fn, future, deadline, what = self._requests.get_nowait()
            except queue.Empty:
                return
            try:
                if deadline is not None:
                    deadline.check(what)  # the caller stopped waiting during the batch: leave all as it is
            except BaseException as exc:
                future.set_exception(exc)
                continue
            with paused():
                try:
                    future.set_result(fn())
                except BaseException as exc:
                    future.set_exception(exc)

    def close(self) -> None:
        """Fail every queued call and refuse new ones (the loop is ending)."""
        with self._lock:
            self._closed = True
        while True:
            try:
                queued = self._requests.get_nowait()
            except queue.Empty:
                return
            queued.future.set_exception(ServiceUnavailable("the trainer stopped before running the request"))


class _Queued(NamedTuple):
    """A call waiting for the loop: the function, its caller's future and deadline, and what it does."""

    fn: Callable[[], Any]
    future: Future[Any]
    deadline: CallDeadline | None
    what: str
