"""Inline training (``inline_training=True``; the trainer's choice for a one-executor CPU plan,
``trainer.training_thread``): no executor threads; the caller runs the executors' actions on its own
thread, one per :meth:`InlineTraining.step`, between the arrivals it submits, and the clock's drain runs
what is left (:meth:`InlineTraining.until_idle`). Scheduler, admission rule and actions are the same.

Why: a tiny model's CPU step is a few dozen short kernels, and with a record-path thread beside the
executor every kernel's release of the GIL hands it over and back, so a separate training thread trains
far fewer items than one thread does (``benchmarks/live/README.md``). A prediction then waits for at most
the one action running when its record arrives. An action's service time is counted from the end of the
previous one while the executor had work throughout (the record path's work in between is time it could
not train), else from its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.wall_executors import Executors
from ferret_core.engine.wall_life import ClockLife
from ferret_core.schedule.actions import Action


class InlineTraining:
    """The executors' actions run on the caller's thread: which executor is asked first next time (round
    robin) and when the last action ended while the executors were busy throughout. ``drained``: whether
    every submitted item is dispatched and finished (called under the lock)."""

    def __init__(self, pipeline: Pipeline, life: ClockLife, executors: Executors, drained: Callable[[], bool]) -> None:
        self.pipeline = pipeline
        self._life = life
        self._executors = executors
        self._drained = drained
        self._next_executor = 0  # the executor asked first next time (round robin)
        self._previous_end: float | None = None  # the last action's end, while busy throughout

    def pending(self) -> bool:
        """Whether an admitted item has actions left (the caller should call :meth:`step` soon)."""
        life = self._life
        with life.cv:
            return not life.stopping and life.error is None and not self.pipeline.scheduler.idle()

    def step(self) -> bool:
        """Run one ready action on the calling thread (the executors are asked in turn); false when none is
        ready. A failure stops the clock, as an executor thread's does, and is raised."""
        life = self._life
        with life.cv:
            life.raise_if_failed()
            chosen = None if life.stopping else self._ready_action()
        if chosen is None:
            self._previous_end = None  # nothing ready: the next action's time is its own
            return False
        action, worker, stage = chosen
        began = time.perf_counter()
        try:
            self.pipeline.execute(action, self._executors.stamps)
        except BaseException as exc:
            life.record_failure(exc)
            raise
        ended = time.perf_counter()
        took = ended - (began if self._previous_end is None else self._previous_end)
        with life.cv:
            self._executors.finished(action, worker, stage, ended - began, took)
            # busy throughout only while admitted items remain: after an idle spell an action's time is its own
            self._previous_end = None if self.pipeline.scheduler.idle() else ended
        return True

    def until(self, deadline: float) -> None:
        """Run ready actions until ``deadline`` (``perf_counter`` seconds) or until none is ready."""
        while time.perf_counter() < deadline and self.step():
            pass

    def until_idle(self, timeout: float | None) -> None:
        """The drain: run actions until every submitted item is dispatched and finished."""
        life = self._life
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            with life.cv:
                life.raise_if_failed()
                if self._drained():
                    return
            if not self.step():
                with life.cv:  # another caller runs the ready action (a drain beside the loop): wait for it
                    life.raise_if_failed()
                    if self._drained():
                        return
                    life.cv.wait(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"the pipeline did not drain within {timeout} s")

    def _ready_action(self) -> tuple[Action, int, int] | None:
        """The next ready action of the executors, asked round robin from the one after the last that ran
        (under the lock); started."""
        scheduler = self.pipeline.scheduler
        live = self._executors.live
        count = len(live)
        for k in range(count):
            worker, stage = live[(self._next_executor + k) % count]
            action = scheduler.next_action(worker, stage)
            if action is not None:
                scheduler.start(action)
                self._next_executor = (self._next_executor + k + 1) % count
                return action, worker, stage
        return None
