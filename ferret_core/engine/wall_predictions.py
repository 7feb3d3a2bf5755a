"""The wall clock's arrivals: their queue, the master's predictions of them, and their dispatch.

:meth:`~ferret_core.engine.wall_clock.WallClock.submit` queues an arrival; a prediction executor
predicts it with the master and dispatches it, in submission order. Arrivals that queued up together (a
consumer batch after a pause or a re-plan) are predicted in one forward pass, up to :data:`PREDICT_BATCH`
at a time, on the same master version, then dispatched one by one: a backlog of k items costs about one
forward pass, not k. With ``inline_predictions=True`` (what the trainer runs) there is no prediction
thread: the caller that waits for an outcome predicts and dispatches everything queued so far itself
(:meth:`Predictions.predict_queued`, same batches and order), which saves a hand-over to another thread
and back per item. Either way predictions never wait behind training: they read the master under the
masters' guard and take the pipeline's lock only to dispatch.
"""

from __future__ import annotations

import itertools
import queue
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from torch import Tensor

from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.wall_admission import ClockAdmission
from ferret_core.engine.wall_life import ClockLife, ClockStopped
from ferret_core.engine.wall_streams import stream_for
from ferret_core.schedule.actions import SkipReason

PREDICT_BATCH = 64  # queued arrivals predicted in one forward pass


@dataclass(frozen=True, slots=True)
class Arrival:
    """What became of a submitted item: its stream index, the master's prediction (and its softmax
    probability), and either the worker the pipeline dispatched it to or, when it was not admitted for
    training, why (exactly one of ``worker`` and ``skipped`` is set). ``top_k``: the clock's ``top_k``
    most probable classes as (class, probability), most probable first (``top_k[0]`` is ``prediction``
    with ``confidence``). ``version``: the optimizer updates the masters that predicted it had taken, over
    the stages (each update publishes the next version of its stage)."""

    index: int
    prediction: int
    skipped: SkipReason | None
    confidence: float = float("nan")
    worker: int | None = None
    top_k: tuple[tuple[int, float], ...] = ()
    version: int = 0  # updates applied to the masters that predicted it (the sum of the stages' versions)


_Entry = tuple[int, Tensor, int | None, float | None, Future[Arrival]]


class Predictions:
    """The queue of submitted arrivals (``None`` in it: the prediction thread ends), the numbers
    submitted and dispatched, and who predicts them: the prediction thread (:meth:`loop`) or, with
    ``inline``, whoever calls :meth:`predict_queued` (one caller at a time, so in submission order)."""

    def __init__(
        self, pipeline: Pipeline, life: ClockLife, admission: ClockAdmission, *, top_k: int, inline: bool
    ) -> None:
        self.pipeline = pipeline
        self.top_k = top_k
        self.inline = inline
        self._life = life
        self._admission = admission
        self._queue: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self._inline = threading.Lock()  # one caller predicts the queue at a time (submission order)
        self._counter = itertools.count()
        self._submitted = 0
        self._dispatched = 0
        self._device = pipeline.devices[0]

    def submit(self, x: Tensor, y: int | None, index: int | None, event_time: float | None) -> Future[Arrival]:
        """Queue one arrival (numbered by the clock from 0 when ``index`` is ``None``); its future."""
        life = self._life
        with life.cv:
            life.raise_if_failed()
            if life.stopping or not life.started:
                raise ClockStopped("the wall clock is not running: start() it (or it was closed)")
            self._submitted += 1
        future: Future[Arrival] = Future()
        self._queue.put((next(self._counter) if index is None else index, x, y, event_time, future))
        return future

    def drained(self) -> bool:
        """Every submitted item dispatched and every admitted one finished (call under the lock)."""
        return self._dispatched == self._submitted and self.pipeline.scheduler.idle()

    def predict_queued(self) -> None:
        """Inline predictions: predict and dispatch, on the calling thread, every arrival queued so far (in
        submission order, up to :data:`PREDICT_BATCH` per forward pass). A failure fails every queued
        arrival, stops the clock (as a thread's failure does) and is raised."""
        with self._inline:
            while True:
                batch: list[_Entry] = []
                while len(batch) < PREDICT_BATCH:
                    try:
                        entry = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if entry is not None:
                        batch.append(entry)
                if not batch:
                    return
                try:
                    self._predict(batch)
                except BaseException as exc:
                    self._fail_queued(exc)
                    self._life.record_failure(exc)
                    raise

    def close(self) -> None:
        """The clock closes: the prediction thread ends; inline, the arrivals still queued fail
        (:class:`ClockStopped`)."""
        if self.inline:
            with self._inline:
                self._fail_queued(ClockStopped("the wall clock was closed before this arrival was predicted"))
        else:
            self._queue.put(None)

    def loop(self) -> None:
        """The prediction thread: predict what is queued, in batches, until the queue yields ``None``."""
        with stream_for(self._device):
            while True:
                entry = self._queue.get()
                if entry is None:
                    return
                batch = [entry]
                closing = False
                while len(batch) < PREDICT_BATCH:  # what queued up meanwhile: one forward pass for all
                    try:
                        more = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        closing = True
                        break
                    batch.append(more)
                try:
                    self._predict(batch)
                except BaseException as exc:
                    self._fail_queued(exc)
                    raise
                if closing:
                    return

    def _predict(self, batch: list[_Entry]) -> None:
        """Predict every entry (one forward pass per run of equally shaped inputs), then dispatch them in
        submission order, each under the lock, and settle its future."""
        p = self.pipeline
        cv = self._life.cv
        start = 0
        while start < len(batch):
            end = start + 1
            while end < len(batch) and batch[end][1].shape == batch[start][1].shape:
                end += 1
            group = batch[start:end]
            try:
                masters = p.masters()  # the version that predicts: its update count goes with each Arrival
                version = sum(v.version for v in masters)
                xs = group[0][1].unsqueeze(0) if len(group) == 1 else torch.stack([e[1] for e in group])
                top_ks = p.predict_top_k_batch(xs, self.top_k, masters)
                del masters
                for offset, (index, x, y, event_time, future) in enumerate(group):
                    top_k = top_ks[offset]
                    prediction, confidence = top_k[0]
                    with cv:
                        skipped = p.dispatch(index, x, y, prediction, self._admission.rule(event_time))
                        p.pull()
                        worker = p.worker_of(index) if skipped is None else None
                        self._dispatched += 1
                        cv.notify_all()
                    future.set_result(Arrival(index, prediction, skipped, confidence, worker, top_k, version))
            except BaseException as exc:
                for entry in batch[start:]:
                    if not entry[4].done():
                        entry[4].set_exception(exc)
                raise
            start = end

    def _fail_queued(self, exc: BaseException) -> None:
        """Every arrival still queued gets the failure (none waits forever)."""
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return
            if entry is not None and not entry[4].done():
                entry[4].set_exception(exc)
