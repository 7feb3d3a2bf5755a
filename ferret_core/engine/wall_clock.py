"""The wall clock: real executors driven by the same scheduler (DESIGN §2).

One thread per live (worker, stage) executor asks :class:`~ferret_core.schedule.scheduler.Scheduler` for
its next action, runs it through :meth:`Pipeline.execute` outside the lock, and reports it finished
(:mod:`ferret_core.engine.wall_executors`). The first exception raised in any thread stops every thread
and is re-raised in the caller by the next :meth:`WallClock.submit`, :meth:`WallClock.drain` or
:meth:`WallClock.close` (as torchgpipe's workers do; :mod:`ferret_core.engine.wall_life`).

:class:`WallClock` is the facade over the parts, each owning its own state:

- predictions (:mod:`ferret_core.engine.wall_predictions`): the arrivals' queue, their prediction by the
  master in batches of up to :data:`PREDICT_BATCH`, on a prediction thread or inline in the caller that
  waits for an outcome (``inline_predictions=True``), and their dispatch;
- inline training (:mod:`ferret_core.engine.inline_training`, ``inline_training=True``): no executor
  threads; the caller runs the executors' actions on its own thread between its arrivals;
- admission (:mod:`ferret_core.engine.wall_admission`): by event time, at each worker's measured
  service time;
- devices (:mod:`ferret_core.engine.wall_streams`): a CUDA stream per executor thread, and a barrier
  before an action's results are published.

Staleness. The wall clock does not enforce the schedule's staleness bound (DESIGN §3.13): executors run
when their inputs are ready, so a worker slowed by the machine can apply a staler gradient. A
compensator's delta ring grows to the staleness a gradient had (up to :data:`RING_GROWTH` × the bound;
the bytes are measured), and a compensation that found too few deltas is cut short and counted
(``EngineStats.compensations_truncated``).

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

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future

from torch import Tensor

from ferret_core.engine.admission import AdmissionSettings, ServiceTimes
from ferret_core.engine.inline_training import InlineTraining
from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.virtual_clock import Sample
from ferret_core.engine.wall_admission import ClockAdmission
from ferret_core.engine.wall_executors import Executors
from ferret_core.engine.wall_life import ClockLife, ClockStopped
from ferret_core.engine.wall_predictions import PREDICT_BATCH, Arrival, Predictions
from ferret_core.engine.wall_streams import cuda_action_barrier
from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.staleness import staleness_bound

__all__ = ["PREDICT_BATCH", "RING_GROWTH", "Arrival", "ClockStopped", "WallClock", "cuda_action_barrier"]

# How far a compensator's delta ring may grow past the schedule's staleness bound on the wall clock
# (which runs stages as fast as their executors do, so a gradient may be staler than the bound).
RING_GROWTH = 4


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
        self.inline_training = inline_training
        self.inline_predictions = inline_predictions or inline_training  # one thread does both
        # the parts, each owning its state (module docstring): 1. the life cycle and the first failure
        self._life = ClockLife(pipeline.lock)
        # 2. the measured service times and admission by event time
        self._admission = ClockAdmission(pipeline, admission)
        # 3. the compensators' delta rings follow the staleness the wall clock may reach
        plan = pipeline.plan
        for stage, compensator in enumerate(pipeline.compensators):
            compensator.follow_staleness(RING_GROWTH * max(1, staleness_bound(plan, stage)))
        # 4. arrivals and their predictions, 5. the executors, 6. inline training over them
        self._predictions = Predictions(
            pipeline, self._life, self._admission, top_k=top_k, inline=self.inline_predictions
        )
        self._executors = Executors(pipeline, self._life, self._admission)
        self._training = InlineTraining(pipeline, self._life, self._executors, self._predictions.drained)

    @property
    def service_times(self) -> ServiceTimes:
        """Each worker's measured service time per stage (what admission by event time reads)."""
        return self._admission.service_times

    @property
    def admission(self) -> AdmissionSettings | None:
        """The settings of admission by event time (``None``: the policy's slot rule decides)."""
        return self._admission.settings

    @property
    def executor_seconds(self) -> float:
        """The executors' action wall time, summed (:meth:`admission_view`)."""
        return self._admission.executor_seconds

    @property
    def charged_seconds(self) -> float:
        """What the service times were charged for the actions (incl. the gaps between actions)."""
        return self._admission.charged_seconds

    @property
    def origin(self) -> float:
        """When the clock started (``perf_counter`` seconds): the trace's time 0."""
        return self._executors.stamps.origin

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> WallClock:
        life = self._life
        if life.started:
            raise ScheduleError(
                "the wall clock is already started: start() it once (a `with` block starts it), and close() it "
                "before starting it again"
            )
        life.started = True
        self._executors.restart_stamps()
        if not self.inline_training:
            for worker, stage in self._executors.live:
                life.spawn(f"ferret-w{worker}s{stage}", self._executors.loop, worker, stage)
        if not self.inline_predictions:
            life.spawn("ferret-predict", self._predictions.loop)
        return self

    def close(self, *, reraise: bool = True) -> None:
        """Stop every thread (items in flight are abandoned; call :meth:`drain` first to finish them) and
        re-raise a thread's failure unless ``reraise`` is false."""
        self._life.stop()
        self._predictions.close()
        self._life.join()
        if reraise:
            self._life.raise_if_failed()

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
        settings it is admitted by event time (:mod:`ferret_core.engine.wall_admission`)."""
        return self._predictions.submit(x, y, index, event_time)

    def predict_queued(self) -> None:
        """Inline predictions: predict and dispatch, on the calling thread, every arrival queued so far (in
        submission order, up to :data:`PREDICT_BATCH` per forward pass). A no-op with a prediction thread.
        A failure fails every queued arrival, stops the clock (as a thread's failure does) and is raised."""
        if self.inline_predictions:
            self._predictions.predict_queued()

    def outcome(self, future: Future[Arrival], timeout: float | None = None) -> Arrival:
        """``future.result(timeout)``, predicting what is queued first where predictions are inline."""
        if not future.done():
            self.predict_queued()
        return future.result(timeout)

    def measured_service_times(self) -> tuple[float | None, ...]:
        """Per worker, its measured busy seconds per item at its slowest stage (``None`` for a worker not
        measured yet: removed, or fewer than a window of items so far): what the admission rule uses, and
        what the live planner compares with the plan's profiled times (``docs/planner.md`` reading 11)."""
        return self._admission.measured()

    def admission_view(self, worker: int) -> dict[str, float | int | None]:
        """What the admission rule believes for ``worker`` now (a diagnosis aid, read without the lock):
        its service time s and W in the machine's time (seconds), the real queue's bound ⌊(W + H)/s⌋, the
        items waiting for it, and the executors' action seconds and charged seconds so far."""
        return self._admission.view(worker)

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every submitted item is predicted, dispatched and, if admitted, finished."""
        self.predict_queued()
        if self.inline_training:
            self._training.until_idle(timeout)
            return
        life = self._life
        with life.cv:
            done = life.cv.wait_for(lambda: life.error is not None or self._predictions.drained(), timeout)
            life.raise_if_failed()
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
        return self.inline_training and self._training.pending()

    def train_step(self) -> bool:
        """Inline training: run one ready action on the calling thread (the executors are asked in turn);
        false when none is ready, or with executor threads (a no-op there). A failure stops the clock, as
        an executor thread's does, and is raised."""
        return self.inline_training and self._training.step()

    def train_until(self, deadline: float) -> None:
        """Inline training: run ready actions on the calling thread until ``deadline`` (``perf_counter``
        seconds) or until none is ready — what a caller that paces its own arrivals does instead of
        sleeping. A no-op with executor threads."""
        if self.inline_training:
            self._training.until(deadline)
