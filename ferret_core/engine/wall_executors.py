"""The wall clock's executors: one per live (worker, stage), each a thread that asks the
:class:`~ferret_core.schedule.scheduler.Scheduler` for its next action, runs it through
:meth:`Pipeline.execute` outside the lock, and reports it finished (DESIGN §2).

What an action's end does is the same whether an executor thread or the caller ran it (inline training,
:mod:`ferret_core.engine.inline_training`): the scheduler hears of it, the worker is charged its cost
(:class:`~ferret_core.engine.wall_admission.ClockAdmission`), a buffering method draws its next
mini-batch, and whoever waits for the pipeline is woken (:meth:`Executors.finished`).
"""

from __future__ import annotations

import time

from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.wall_admission import ClockAdmission
from ferret_core.engine.wall_life import ClockLife, WallStamps
from ferret_core.engine.wall_streams import stream_for
from ferret_core.schedule.actions import Action, Kind


class Executors:
    """The live (worker, stage) executors of one pipeline (``live``, in worker then stage order), the
    trace's time stamps since the clock started, and the executor threads' run loop."""

    def __init__(self, pipeline: Pipeline, life: ClockLife, admission: ClockAdmission) -> None:
        self.pipeline = pipeline
        self._life = life
        self._admission = admission
        plan = pipeline.plan
        self.live = [(w.index, j) for w in plan.workers if w.live for j in range(plan.num_stages)]
        self.stamps = WallStamps(time.perf_counter())
        self._devices = pipeline.devices

    def restart_stamps(self) -> None:
        """Trace times count from now (the clock starts)."""
        self.stamps = WallStamps(time.perf_counter())

    def finished(self, action: Action, worker: int, stage: int, action_s: float, charged_s: float) -> None:
        """An action has run (under the lock): the scheduler, the admission's service times, the buffering
        methods' next mini-batch, and whoever waits for the pipeline."""
        self.pipeline.scheduler.finish(action)
        self._admission.charge(worker, stage, action_s, charged_s, forward=action.kind is Kind.F)
        self.pipeline.pull()  # a buffering method draws its next mini-batch once the trainer is free
        self._life.cv.notify_all()

    def loop(self, worker: int, stage: int) -> None:
        """Executor (``worker``, ``stage``)'s thread: run its actions as they become ready, until the clock
        stops."""
        life = self._life
        with stream_for(self._devices[stage]):
            p = self.pipeline
            scheduler = p.scheduler
            previous_end: float | None = None
            action: Action | None = None  # the next action, when it was started with the previous one's finish
            while True:
                waited = False
                if action is None:
                    with life.cv:
                        while not life.stopping:
                            action = scheduler.next_action(worker, stage)
                            if action is not None:
                                scheduler.start(action)
                                break
                            waited = True
                            life.cv.wait()
                        if action is None:
                            return
                began = time.perf_counter()
                p.execute(action, self.stamps)
                ended = time.perf_counter()
                # the worker's cost of this action: from the end of its previous one when it went straight on
                # (the bookkeeping, the lock and the GIL between actions are its cost too), else its own time
                took = ended - (began if waited or previous_end is None else previous_end)
                previous_end = ended
                with life.cv:
                    self.finished(action, worker, stage, ended - began, took)
                    # the executor's next action, chosen and started in the same hold of the lock (what the
                    # loop's head would do after taking the lock again): one lock round trip per action
                    # instead of two, e.g. a one-stage plan's B right after its F
                    action = None if life.stopping else scheduler.next_action(worker, stage)
                    if action is not None:
                        scheduler.start(action)
