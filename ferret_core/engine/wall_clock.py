"""The wall clock: real executors driven by the same scheduler (DESIGN §2).

One thread per live (worker, stage) executor asks :class:`~ferret_core.schedule.scheduler.Scheduler` for
its next action, runs it through :meth:`Pipeline.execute` outside the lock, and reports it finished.
The first exception raised in any thread stops every thread and is re-raised in the caller by the next
:meth:`submit`, :meth:`drain` or :meth:`close` (as torchgpipe's workers do).

Predictions. :meth:`WallClock.submit` queues an arrival; a prediction executor predicts it with the
master and dispatches it, in submission order. Arrivals that queued up together (a consumer batch after
a pause or a re-plan) are predicted in one forward pass, up to :data:`PREDICT_BATCH` at a time, on the
same master version, then dispatched one by one: a backlog of k items costs about one forward pass, not
k. With ``inline_predictions=True`` (what the trainer runs) there is no prediction thread: the caller
that waits for an outcome predicts and dispatches everything queued so far itself
(:meth:`WallClock.predict_queued`, same batches and order), which saves a hand-over to another thread
and back per item. Either way predictions never wait behind training: they read the master under the
masters' guard and take the pipeline's lock only to dispatch.

Inline training (``inline_training=True``; the trainer's choice for a one-executor CPU plan,
``trainer.training_thread``): no executor threads; the caller runs the executors' actions on its own
thread, one per :meth:`WallClock.train_step`, between the arrivals it submits, and :meth:`WallClock.drain`
runs what is left. Scheduler, admission rule and actions are the same. Why: a tiny model's CPU step is a
few dozen short kernels, and with a record-path thread beside the executor every kernel's release of the
GIL hands it over and back, so a separate training thread trains far fewer items than one thread does
(``benchmarks/live/README.md``). A prediction then waits for at most the one action running when its
record arrives. An action's service time is counted from the end of the previous one while the executor
had work throughout (the record path's work in between is time it could not train), else from its start.

Admission. An arrival submitted with an ``event_time``, under ``admission`` settings, is admitted by
event time (:mod:`ferret_core.engine.admission`): its worker takes it iff its queue holds fewer than
``queue_slots`` items and it would start the item within ``max_wait_s`` of its event time at the
worker's measured service time (:class:`~ferret_core.engine.admission.ServiceTimes`). Each action's cost
is counted from the end of the executor's previous action when it went straight on, because the
bookkeeping, lock and GIL waits between a busy worker's actions are part of what an item costs: counting
the actions alone under-estimates a worker that shares the CPU with the record path, and the rule then
admits more than it trains (the real queue, up to K, grows behind the predictions). Without an event
time or settings, the policy's own slot rule decides (:mod:`ferret_core.schedule.scheduler`).

Staleness. The wall clock does not enforce the schedule's staleness bound (DESIGN §3.13): executors run
when their inputs are ready, so a worker slowed by the machine can apply a staler gradient. A
compensator's delta ring grows to the staleness a gradient had (up to :data:`RING_GROWTH` × the bound;
the bytes are measured), and a compensation that found too few deltas is cut short and counted
(``EngineStats.compensations_truncated``).

Devices. On CPU the threads share the cores (one torch thread each; the GIL serialises the Python
parts, kernels release it). On CUDA each executor thread issues its work on a CUDA stream of its own
and, before publishing an action's results, records an event on that stream and waits for it, so a
tensor handed to another stream or thread is complete and its memory is not reused while a kernel
reads it (tests marked ``gpu``).

In-place updates. An update writes a master in place only when nothing else references it (no stash,
no other replica, no prediction running on it: :meth:`~ferret_core.engine.stage_update.StageUpdater.apply`,
decided and written under the masters' guard, so a prediction waits at most for that one write, ~0.2 ms
on MNISTNet). A 1 × 1 plan's updates are in place, as a plain loop's are; on CUDA never (a prediction's
kernels may still read a master after its reference is dropped).

Buffering methods (random-n, last-n, camel): an arrival their window takes is reported as admitted
(``skipped`` is ``None``); its fate is decided when the trainer is free and draws a mini-batch
(:meth:`Pipeline.pull` after every dispatch and finished action); the items the window drops are counted
in the engine's counters (``evicted``, ``not_selected``). A drain leaves in the window what is too few
for a mini-batch.

The history of these choices, with the measurements behind them, is in ``docs/history.md``.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass

import torch
from torch import Tensor

from ferret_core.engine.admission import AdmissionSettings, EventTimeAdmission, ServiceTimes
from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.virtual_clock import Sample
from ferret_core.errors import ConfigError, FerretError, ScheduleError
from ferret_core.schedule.actions import Action, Kind, SkipReason
from ferret_core.staleness import staleness_bound

log = logging.getLogger("ferret.admission")

PREDICT_BATCH = 64  # queued arrivals predicted in one forward pass

# How far a compensator's delta ring may grow past the schedule's staleness bound on the wall clock
# (which runs stages as fast as their executors do, so a gradient may be staler than the bound).
RING_GROWTH = 4


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


class _WallStamps:
    """Trace times read from the wall clock, in seconds since the clock started."""

    def __init__(self, origin: float) -> None:
        self._origin = origin

    def start(self) -> float:
        return time.perf_counter() - self._origin

    def split(self) -> float:
        return time.perf_counter() - self._origin

    def end(self) -> float:
        return time.perf_counter() - self._origin


class ClockStopped(FerretError, RuntimeError):
    """The wall clock was closed or failed before the call."""


class WallClock:
    """Threads for every live (worker, stage) executor and for predictions, over one pipeline.
    ``top_k``: how many of the most probable classes each :class:`Arrival` reports (>= 1)."""

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        top_k: int = 1,
        admission: AdmissionSettings | None = None,
        inline_predictions: bool = False,
        inline_training: bool = False,
    ) -> None:
        if top_k < 1:
            raise ConfigError(f"top_k must be >= 1, got {top_k}")
        on_cuda = any(d.type == "cuda" for d in pipeline.devices)
        if inline_training and on_cuda:
            raise ConfigError(
                "inline training runs CPU stages only (expected every stage on the CPU, got "
                f"{[str(d) for d in pipeline.devices]}); use the executor threads (trainer.training_thread: executors)"
            )
        self.pipeline = pipeline
        self.top_k = top_k
        if on_cuda:
            pipeline.in_place = False
            pipeline.end_of_action = cuda_action_barrier
        self._cv = threading.Condition(pipeline.lock)
        self._queue: queue.SimpleQueue[_Entry | None] = queue.SimpleQueue()
        self.inline_training = inline_training
        self.inline_predictions = inline_predictions or inline_training  # one thread does both
        self._inline = threading.Lock()  # one caller predicts the queue at a time (submission order)
        plan = pipeline.plan
        initial = plan.stage_forward_time + plan.stage_backward_time
        if admission is not None:
            initial = max(initial, admission.initial_service_s)
        self.service_times = ServiceTimes(plan.num_workers, plan.num_stages, initial)
        self.admission = admission
        self._event_rule = None if admission is None else EventTimeAdmission(plan.num_workers, admission.max_wait_s)
        for stage, compensator in enumerate(pipeline.compensators):
            compensator.follow_staleness(RING_GROWTH * max(1, staleness_bound(plan, stage)))
        self._counter = itertools.count()
        self.executor_seconds = 0.0  # the executors' action wall time, summed (admission_view)
        self.charged_seconds = 0.0  # what ServiceTimes was charged for them (incl. the gaps between actions)
        self._submitted = 0
        self._dispatched = 0
        self._error: BaseException | None = None
        self._stopping = False
        self._started = False
        self._threads: list[threading.Thread] = []
        self._executors = [(w.index, j) for w in plan.workers if w.live for j in range(plan.num_stages)]
        self._next_executor = 0  # inline training: the executor asked first next time (round robin)
        self._previous_end: float | None = None  # inline training: the last action's end, while busy throughout
        self.origin = time.perf_counter()
        self._stamps = _WallStamps(self.origin)
        self._devices = pipeline.devices

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> WallClock:
        if self._started:
            raise ScheduleError(
                "the wall clock is already started: start() it once (a `with` block starts it), and close() it "
                "before starting it again"
            )
        self._started = True
        self.origin = time.perf_counter()
        self._stamps = _WallStamps(self.origin)
        if not self.inline_training:
            for worker, stage in self._executors:
                self._spawn(f"ferret-w{worker}s{stage}", self._executor_loop, worker, stage)
        if not self.inline_predictions:
            self._spawn("ferret-predict", self._prediction_loop)
        return self

    def close(self, *, reraise: bool = True) -> None:
        """Stop every thread (items in flight are abandoned; call :meth:`drain` first to finish them) and
        re-raise a thread's failure unless ``reraise`` is false."""
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        if self.inline_predictions:
            with self._inline:
                self._fail_queued(ClockStopped("the wall clock was closed before this arrival was predicted"))
        else:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        self._threads = []
        self._started = False
        if reraise:
            self._raise_if_failed()

    def __enter__(self) -> WallClock:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(reraise=exc_type is None)

    # ------------------------------------------------------------------------------------- arrivals
    def submit(
        self, x: Tensor, y: int | None, *, index: int | None = None, event_time: float | None = None
    ) -> Future[Arrival]:
        """Queue one arrival (a sample without batch dimension); the future gives its prediction.

        ``index`` is the item's number in the stream (the dispatch index i: worker i mod N); by default
        the clock numbers arrivals itself from 0. A trainer that restarts or re-plans passes its own
        counter so dispatch stays i ≡ c_n^d (mod N) across pipelines (DESIGN §4). ``event_time``: when the
        item entered the stream, in seconds on any axis the stream's items share; with ``admission``
        settings it is admitted by event time (module docstring)."""
        with self._cv:
            self._raise_if_failed()
            if self._stopping or not self._started:
                raise ClockStopped("the wall clock is not running: start() it (or it was closed)")
            self._submitted += 1
        future: Future[Arrival] = Future()
        self._queue.put((next(self._counter) if index is None else index, x, y, event_time, future))
        return future

    def predict_queued(self) -> None:
        """Inline predictions: predict and dispatch, on the calling thread, every arrival queued so far (in
        submission order, up to :data:`PREDICT_BATCH` per forward pass). A no-op with a prediction thread.
        A failure fails every queued arrival, stops the clock (as a thread's failure does) and is raised."""
        if not self.inline_predictions:
            return
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
                    self._record_failure(exc)
                    raise

    def outcome(self, future: Future[Arrival], timeout: float | None = None) -> Arrival:
        """``future.result(timeout)``, predicting what is queued first where predictions are inline."""
        if not future.done():
            self.predict_queued()
        return future.result(timeout)

    def measured_service_times(self) -> tuple[float | None, ...]:
        """Per worker, its measured busy seconds per item at its slowest stage (``None`` for a worker not
        measured yet: removed, or fewer than a window of items so far): what the admission rule uses, and
        what the live planner compares with the plan's profiled times (``docs/planner.md`` reading 11)."""
        return tuple(self.service_times.measured(n) for n in range(self.pipeline.plan.num_workers))

    def admission_view(self, worker: int) -> dict[str, float | int | None]:
        """What the admission rule believes for ``worker`` now (a diagnosis aid, read without the lock):
        its service time s and W in the machine's time (seconds), the real queue's bound ⌊(W + H)/s⌋, the
        items waiting for it, and the executors' action seconds and charged seconds so far."""
        service_s = self.service_times.service_time(worker)
        settings = self.admission
        wait_s = None if settings is None else settings.wait_for(service_s)
        slots = None if settings is None or wait_s is None else settings.start_slots(wait_s, service_s)
        return {
            "service_s": service_s,
            "wait_s": wait_s,
            "start_slots": slots,
            "waiting": self.pipeline.scheduler.waiting(worker),
            "executor_s": self.executor_seconds,
            "charged_s": self.charged_seconds,
        }

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every submitted item is predicted, dispatched and, if admitted, finished."""
        self.predict_queued()
        if self.inline_training:
            self._train_until_idle(timeout)
            return
        with self._cv:
            done = self._cv.wait_for(lambda: self._error is not None or self._drained(), timeout)
            self._raise_if_failed()
            if not done:
                raise TimeoutError(f"the pipeline did not drain within {timeout} s")

    def run_stream(
        self, items: Iterable[Sample], arrival_interval: float, on_arrival: Callable[[int], None] | None = None
    ) -> None:
        """Submit item i at i·``arrival_interval`` seconds after the first, then drain (inline training:
        training in the gaps between arrivals, one action at a time)."""
        first = time.perf_counter()
        for i, item in enumerate(items):
            due = first + i * arrival_interval
            self.train_until(due)
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.submit(item.x, item.y)
            self.predict_queued()
            if on_arrival is not None:
                on_arrival(i)
        self.drain()

    # ------------------------------------------------------------------------------- inline training
    def pending_training(self) -> bool:
        """Inline training: whether an admitted item has actions left (the caller should call
        :meth:`train_step` soon). Always false with executor threads (they train by themselves)."""
        if not self.inline_training:
            return False
        with self._cv:
            return not self._stopping and self._error is None and not self.pipeline.scheduler.idle()

    def train_step(self) -> bool:
        """Inline training: run one ready action on the calling thread (the executors are asked in turn);
        false when none is ready, or with executor threads (a no-op there). A failure stops the clock, as
        an executor thread's does, and is raised."""
        if not self.inline_training:
            return False
        with self._cv:
            self._raise_if_failed()
            chosen = None if self._stopping else self._ready_action()
        if chosen is None:
            self._previous_end = None  # nothing ready: the next action's time is its own
            return False
        action, worker, stage = chosen
        began = time.perf_counter()
        try:
            self.pipeline.execute(action, self._stamps)
        except BaseException as exc:
            self._record_failure(exc)
            raise
        ended = time.perf_counter()
        took = ended - (began if self._previous_end is None else self._previous_end)
        with self._cv:
            self._finished(action, worker, stage, ended - began, took)
            # busy throughout only while admitted items remain: after an idle spell an action's time is its own
            self._previous_end = None if self.pipeline.scheduler.idle() else ended
        return True

    def train_until(self, deadline: float) -> None:
        """Inline training: run ready actions on the calling thread until ``deadline`` (``perf_counter``
        seconds) or until none is ready — what a caller that paces its own arrivals does instead of
        sleeping. A no-op with executor threads."""
        while self.inline_training and time.perf_counter() < deadline and self.train_step():
            pass

    def _ready_action(self) -> tuple[Action, int, int] | None:
        """The next ready action of the executors, asked round robin from the one after the last that ran
        (under the lock); started."""
        scheduler = self.pipeline.scheduler
        count = len(self._executors)
        for k in range(count):
            worker, stage = self._executors[(self._next_executor + k) % count]
            action = scheduler.next_action(worker, stage)
            if action is not None:
                scheduler.start(action)
                self._next_executor = (self._next_executor + k + 1) % count
                return action, worker, stage
        return None

    def _train_until_idle(self, timeout: float | None) -> None:
        """Inline training's drain: run actions until every submitted item is dispatched and finished."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        while True:
            with self._cv:
                self._raise_if_failed()
                if self._drained():
                    return
            if not self.train_step():
                with self._cv:  # another caller runs the ready action (a drain beside the loop): wait for it
                    self._raise_if_failed()
                    if self._drained():
                        return
                    self._cv.wait(None if deadline is None else max(0.0, deadline - time.perf_counter()))
            if deadline is not None and time.perf_counter() > deadline:
                raise TimeoutError(f"the pipeline did not drain within {timeout} s")

    def _drained(self) -> bool:
        """Every submitted item dispatched and every admitted one finished (call under the lock)."""
        return self._dispatched == self._submitted and self.pipeline.scheduler.idle()

    def _finished(self, action: Action, worker: int, stage: int, action_s: float, charged_s: float) -> None:
        """An action has run (under the lock): the scheduler, the admission's service times, the buffering
        methods' next mini-batch, and whoever waits for the pipeline."""
        self.pipeline.scheduler.finish(action)
        self.executor_seconds += action_s
        self.charged_seconds += charged_s
        self.service_times.record(worker, stage, charged_s, forward=action.kind is Kind.F)
        self.pipeline.pull()  # a buffering method draws its next mini-batch once the trainer is free
        self._cv.notify_all()

    # ------------------------------------------------------------------------------------- threads
    def _spawn(self, name: str, target: Callable[..., None], *args: int) -> None:
        thread = threading.Thread(target=self._guard, args=(target, *args), name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _guard(self, target: Callable[..., None], *args: int) -> None:
        try:
            target(*args)
        except BaseException as exc:  # re-raised in the caller
            self._record_failure(exc)

    def _record_failure(self, exc: BaseException) -> None:
        """Keep the first failure (re-raised in the caller) and stop every thread."""
        with self._cv:
            if self._error is None:
                self._error = exc
            self._stopping = True
            self._cv.notify_all()

    def _executor_loop(self, worker: int, stage: int) -> None:
        with self._stream_for(stage):
            p = self.pipeline
            scheduler = p.scheduler
            previous_end: float | None = None
            action: Action | None = None  # the next action, when it was started with the previous one's finish
            while True:
                waited = False
                if action is None:
                    with self._cv:
                        while not self._stopping:
                            action = scheduler.next_action(worker, stage)
                            if action is not None:
                                scheduler.start(action)
                                break
                            waited = True
                            self._cv.wait()
                        if action is None:
                            return
                began = time.perf_counter()
                p.execute(action, self._stamps)
                ended = time.perf_counter()
                # the worker's cost of this action: from the end of its previous one when it went straight on
                # (the bookkeeping, the lock and the GIL between actions are its cost too), else its own time
                took = ended - (began if waited or previous_end is None else previous_end)
                previous_end = ended
                with self._cv:
                    self._finished(action, worker, stage, ended - began, took)
                    # the executor's next action, chosen and started in the same hold of the lock (what the
                    # loop's head would do after taking the lock again): one lock round trip per action
                    # instead of two, e.g. a one-stage plan's B right after its F
                    action = None if self._stopping else scheduler.next_action(worker, stage)
                    if action is not None:
                        scheduler.start(action)

    def _prediction_loop(self) -> None:
        with self._stream_for(0):
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
                    with self._cv:
                        skipped = p.dispatch(index, x, y, prediction, self._admit_rule(event_time))
                        p.pull()
                        worker = p.worker_of(index) if skipped is None else None
                        self._dispatched += 1
                        self._cv.notify_all()
                    future.set_result(Arrival(index, prediction, skipped, confidence, worker, top_k, version))
            except BaseException as exc:
                for entry in batch[start:]:
                    if not entry[4].done():
                        entry[4].set_exception(exc)
                raise
            start = end

    def _fail_queued(self, exc: BaseException) -> None:
        """The prediction thread failed: every arrival still queued gets the failure (none waits forever)."""
        while True:
            try:
                entry = self._queue.get_nowait()
            except queue.Empty:
                return
            if entry is not None and not entry[4].done():
                entry[4].set_exception(exc)

    def _admit_rule(self, event_time: float | None) -> Callable[[int], bool] | None:
        """Admission by event time for one arrival (None: the policy's slot rule decides)."""
        settings, rule = self.admission, self._event_rule
        if settings is None or rule is None or event_time is None:
            return None
        scheduler, service = self.pipeline.scheduler, self.service_times

        def admit(worker: int) -> bool:
            service_s = service.service_time(worker)
            wait_s = settings.wait_for(service_s)  # W in the machine's time (admission.py)
            if not scheduler.can_admit(worker, settings.queue_slots):
                self._log_busy("queue full", worker, event_time, service_s, wait_s)
                return False
            start_slots = settings.start_slots(wait_s, service_s)
            if start_slots is not None and not scheduler.can_admit(worker, start_slots):
                self._log_busy("would start > W + H from now", worker, event_time, service_s, wait_s)
                return False
            if not rule.admit(worker, event_time, service_s, wait_s):
                self._log_busy("would wait > W", worker, event_time, service_s, wait_s)
                return False
            return True

        return admit

    def _log_busy(self, why: str, worker: int, event_time: float, service_s: float, wait_s: float) -> None:
        """At DEBUG (logger ``ferret.admission``), why an item was skipped ``busy``: the rule's inputs (service
        time, wait, event time) for diagnosing skips at a rate the worker should keep up with."""
        if not log.isEnabledFor(logging.DEBUG):
            return
        settings, rule = self.admission, self._event_rule
        assert settings is not None and rule is not None
        log.debug(
            "busy (%s): worker %d, event time %.3f s, wait %.4f s vs W %.4f s, queue %d vs K %d, service %.5f s",
            why, worker, event_time, rule.wait(worker, event_time), wait_s,
            self.pipeline.scheduler.waiting(worker), settings.queue_slots, service_s,
        )  # fmt: skip

    def _stream_for(self, stage: int) -> torch.cuda.StreamContext | _NoStream:
        device = self._devices[stage]
        if device.type == "cuda":
            return torch.cuda.stream(torch.cuda.Stream(device))  # type: ignore[no-untyped-call]
        return _NoStream()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error


class _NoStream:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def cuda_action_barrier() -> None:
    """Make an action's work on the current CUDA stream complete before its results are published."""
    event = torch.cuda.Event()  # type: ignore[no-untyped-call]
    event.record()
    event.synchronize()
