"""What the workers of a plan do when an action runs: the state both clocks drive (DESIGN §3.13, §2).

:class:`Pipeline` owns the versions, the scheduler, the per-item state and the counters, and composes the
parts that own the rest: the stage updater (:mod:`ferret_core.engine.stage_update`: optimizer, compensators,
stage locks, accumulation buffers, the writes of new masters), the predictor
(:mod:`ferret_core.engine.predictor`: passes on the masters outside the executors) and the memory meter's
sources (:mod:`ferret_core.engine.pipeline_memory`). A clock calls

* :meth:`Pipeline.predict` then :meth:`Pipeline.dispatch` for every arrival (the master predicts every
  item, skipped or not, before any training on it; dispatch: slot n = i mod N, reasons
  ``no_label`` → ``worker_removed`` → ``omitted`` → ``busy``);
* :meth:`Pipeline.execute` for each action the scheduler chose, between ``scheduler.start`` and
  ``scheduler.finish``;
* :meth:`Pipeline.pull` after every arrival and completion (a buffering method's feeder starts a
  mini-batch when the trainer is free) and :meth:`Pipeline.finish_stream` once the stream has ended.

What an admitted item trains is a :class:`~ferret_core.engine.steps.TrainingStep` built by the OCL
algorithm (:mod:`ferret_core.engine.steps`; ``vanilla`` by default): its batch goes through the stages,
its loss is back-propagated at the last stage, and the algorithm's ``regularise`` shapes each stage's
update gradient.

Per worker n and stage j (plan semantics, T1–T4):

* **F** reads worker n's replica of stage j. If the item is back-propagated at j (T3: m-th item of the
  worker, ``WorkerConfig.backpropagates``), the replica becomes the item's stash for j and the forward
  keeps its graph — or, with recomputation (T1, c^r_n = 1), runs under ``no_grad`` and keeps only the
  stage input. Otherwise it runs under ``no_grad``, saves nothing and will send no gradient below j.
* **B** (preceded by **R**, a forward on the stash with grad, under T1) computes the stage's parameter
  gradients and, unless j is the item's lowest back-propagated stage, the gradient of its input, which
  becomes stage j−1's ``grad_output``.
* **Accumulation** (T2) and **U**: right after its B, under stage j's lock, the item's gradient is
  compensated from its own read version to the master as it is *then* and added into worker n's one
  accumulation buffer of stage j; the stash is released there. The B that makes the buffer hold c^a_{n,j}
  gradients is followed by U, still under the lock: new master tensors, the master version advances and
  worker n's replica is refreshed to it (:class:`~ferret_core.engine.stage_update.StageUpdater`, whose
  module says what each step computes, and when the update writes in place).
* **Non-finite** values never reach the weights: a gradient that holds NaN or ±inf when B computes it
  (a non-finite loss makes every gradient of the item so), or that compensation makes non-finite, is
  dropped instead of accumulated; the item is counted once as skipped ``non_finite`` (not trained).
  The samples of its step that a buffer keeps for replay (ER/MIR's reservoir, Camel's buffer; the
  step's ``held`` rows) are evicted there, the rows whose output was non-finite if the last stage
  singles them out, else all: a poisoned sample is trained, and dropped, once.

Memory is sampled (independently, :mod:`ferret_core.engine.memory_meter`) after every F, after every R (the
recomputed graph alive), after every B's gradients are computed (before the update) and after every U,
except a U whose sample is provably at most the B sample just before it (a 1 × 1 plain plan's in-place
update with no arrival in between: :meth:`Pipeline._update_sample_dominated`).
Transients inside an action (the prediction path's activations, a gradient being summed) are not
sampled; on CUDA ``max_memory_allocated`` covers them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import Tensor

from ferret_core.compensation import StageCompensator
from ferret_core.engine.memory_meter import MemoryMeter, StorageKey, storage_keys
from ferret_core.engine.optim import Optimizer
from ferret_core.engine.pipeline_memory import PipelineSources
from ferret_core.engine.predictor import MasterView, Predictor
from ferret_core.engine.stage_exec import StageProgram, backward, forward_no_grad, forward_with_grad, on_device
from ferret_core.engine.stage_update import StageUpdater
from ferret_core.engine.state import Counters, InFlightItem, Stamps
from ferret_core.engine.steps import Algorithm, Batch, Feeder, PlainSteps, TrainingStep
from ferret_core.engine.trace import TraceSemantics
from ferret_core.engine.versions import StageVersion, VersionStore
from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.metrics import OnlineAccuracy
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Action, Kind, SkipReason, TraceEvent
from ferret_core.schedule.scheduler import Scheduler, ScheduleRules
from ferret_core.schedule.step_shape import StepShape


class Pipeline:
    """Versions, scheduler, in-flight items and counters of one engine run, with the parts that own the rest
    (:attr:`updater`, :attr:`predictor`; thread-safe where the wall clock needs it: ``lock`` guards
    dispatch, counters, trace and sampling; the updater's stage locks guard updates)."""

    # the kind of stage updater this pipeline's updates run on (a schedule's pipeline may bring its own)
    updater_type: type[StageUpdater] = StageUpdater

    def __init__(
        self,
        plan: Plan,
        rules: ScheduleRules,
        programs: Sequence[StageProgram],
        initial: Sequence[StageVersion],
        *,
        optimizer: Optimizer,
        compensators: Sequence[StageCompensator],
        meter: MemoryMeter | None,
        clone_replicas: bool = False,
        keep_trace: bool = True,
        in_place: bool = True,
        end_of_action: Callable[[], None] | None = None,
        score_online: bool = True,
        algorithm: Algorithm | None = None,
        feeder: Feeder | None = None,
        lr: float = 1e-3,
    ) -> None:
        if len(programs) != plan.num_stages or len(compensators) != plan.num_stages:
            raise ConfigError(f"need one program and one compensator per stage ({plan.num_stages})")
        self.plan = plan
        self.rules = rules
        self.scheduler = Scheduler(rules)
        self.programs = tuple(programs)
        self.store = VersionStore(
            initial, plan.num_workers, clone_replicas=clone_replicas, live=[w.live for w in plan.workers]
        )
        self.meter = meter
        self.counters = Counters(plan.num_workers, plan.num_stages)
        self.online = OnlineAccuracy()
        self.score_online = score_online  # off: the caller scores predictions (see EngineSettings)
        self.trace: list[TraceEvent] | None = [] if keep_trace else None
        self.trace_semantics = TraceSemantics()  # how the validator reads this pipeline's trace
        self.lock = threading.RLock()
        self.end_of_action: Callable[[], None] = end_of_action or (lambda: None)
        self._items: dict[int, InFlightItem] = {}
        # the storage keys of admitted items no action has touched yet (input and target, fixed until their
        # first action): the memory meter reads them instead of walking each waiting item's tensors at
        # every sample — with K items queued that walk would be most of a tiny model's sample
        self._unstarted_keys: dict[int, tuple[StorageKey, ...]] = {}
        self._non_finite: set[int] = set()  # in-flight items with a dropped (non-finite) gradient
        self.failed_item: int | None = None  # the item of the first action that raised
        self._runners = {(w.index, j): p.runner() for w in plan.workers if w.live for j, p in enumerate(programs)}
        self.predictor = Predictor(programs, self.masters)
        self._devices = [v.params[0].device if v.params else torch.device("cpu") for v in initial]
        if feeder is not None and plan.num_workers != 1:
            raise ConfigError(f"a buffering method trains one sequential worker, the plan has {plan.num_workers}")
        if feeder is not None and not feeder.takes_algorithms and algorithm is not None and algorithm.name != "vanilla":
            raise ConfigError(
                f"this buffering method (camel) brings its own anti-forgetting buffer and is not combined with an "
                f"OCL algorithm, got {algorithm.name!r}; use the vanilla algorithm with it, or another method"
            )
        self.feeder = feeder
        self.algorithm: Algorithm = algorithm if algorithm is not None else PlainSteps()
        self.updater = self.updater_type(
            self.store,
            optimizer,
            compensators,
            self.algorithm,
            self.counters,
            in_place=in_place,
            state_changed=self._invalidate_memory,
        )
        # one worker, one stage, a plain method: an in-place update's memory sample may be dominated
        # (see _update_sample_dominated)
        self._single_plain_worker = (
            plan.num_workers == 1 and plan.num_stages == 1 and feeder is None and type(self.algorithm) is PlainSteps
        )
        self._items_at_gradient_sample = -1  # arrivals counted at the last B's memory sample
        self.algorithm.bind(MasterView(programs, self.masters, lr))
        self.sources = PipelineSources(self.store, self.updater, self._items, self._unstarted_keys)
        if meter is not None:  # versions, optimizer and compensator state change at an update (see _update)
            self.sources.register(meter, self.algorithm, feeder)

    @property
    def num_stages(self) -> int:
        return self.plan.num_stages

    def masters(self) -> tuple[StageVersion, ...]:
        """The current master version of every stage, for a reader on any thread (predictions, snapshots):
        holding them keeps them from being overwritten in place (:meth:`StageUpdater.apply`), and they are
        never taken while an in-place write is under way."""
        return self.updater.masters()

    @property
    def devices(self) -> tuple[torch.device, ...]:
        """The device of each stage's tensors."""
        return tuple(self._devices)

    # ------------------------------------------------------------------------------ the updater's state
    @property
    def optimizer(self) -> Optimizer:
        return self.updater.optimizer

    @property
    def compensators(self) -> tuple[StageCompensator, ...]:
        """Each stage's compensator (the updater's)."""
        return self.updater.compensators

    @compensators.setter
    def compensators(self, compensators: tuple[StageCompensator, ...]) -> None:
        self.updater.compensators = compensators

    @property
    def in_place(self) -> bool:
        """Whether an update may overwrite an unshared master in place (the wall clock turns it off on CUDA)."""
        return self.updater.in_place

    @in_place.setter
    def in_place(self, in_place: bool) -> None:
        self.updater.in_place = in_place

    def compensator_states(self) -> list[dict[str, Any]]:
        """Each stage compensator's ``state_dict()`` (:meth:`StageUpdater.compensator_states`)."""
        return self.updater.compensator_states()

    def load_compensator_states(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Restore :meth:`compensator_states` (:meth:`StageUpdater.load_compensator_states`)."""
        self.updater.load_compensator_states(states)

    # ------------------------------------------------------------------------------- the predictions
    def predict(self, x: Tensor) -> int:
        """The master's prediction for one sample (no grad; the caller counts it; :class:`Predictor`)."""
        return self.predictor.predict(x)

    def predict_with_confidence(self, x: Tensor) -> tuple[int, float]:
        """The master's predicted class for one sample and its softmax probability."""
        return self.predictor.predict_with_confidence(x)

    def predict_top_k(self, x: Tensor, k: int) -> tuple[tuple[int, float], ...]:
        """The master's ``k`` most probable classes for one sample (:meth:`Predictor.predict_top_k`)."""
        return self.predictor.predict_top_k(x, k)

    def predict_top_k_batch(
        self, xs: Tensor, k: int, versions: Sequence[StageVersion] | None = None
    ) -> list[tuple[tuple[int, float], ...]]:
        """:meth:`predict_top_k` for every sample of ``xs`` in one pass (:meth:`Predictor.predict_top_k_batch`)."""
        return self.predictor.predict_top_k_batch(xs, k, versions)

    def evaluate(self, x: Tensor, y: Tensor, *, batch: int = 1000) -> float:
        """Test accuracy (percent) of the master on a labelled split, in batches."""
        return self.predictor.evaluate(x, y, batch=batch)

    # -------------------------------------------------------------------------------------- arrivals
    def dispatch(
        self,
        index: int,
        x: Tensor,
        y: int | None,
        prediction: int,
        admit: Callable[[int], bool] | None = None,
    ) -> SkipReason | None:
        """Count the prediction of item ``index`` and admit it to its worker (or, under a buffering method,
        to the method's buffer: its fate is counted when a mini-batch is drawn), or say why not.

        ``admit(worker)``: whether the worker takes the item, in place of the scheduler's slot rule (the
        wall clock's admission by event time, :mod:`ferret_core.engine.admission`); refusing makes the
        item ``busy``. Call under :attr:`lock`, in arrival order.
        """
        c = self.counters
        c.items += 1
        if y is not None and self.score_online:
            self.online.update(prediction, y)
        reason = self._admit(index, x, y, admit)
        if reason is not None:
            c.skipped[reason.value] += 1
        return reason

    def worker_of(self, index: int) -> int:
        """The worker that admitted item ``index`` (in flight; under a buffering method, its one worker,
        whose window holds the item). Call under :attr:`lock`, e.g. right after :meth:`dispatch` admitted
        it."""
        if self.feeder is not None:
            return 0
        return self._items[index].worker

    def _admit(
        self, index: int, x: Tensor, y: int | None, admit: Callable[[int], bool] | None = None
    ) -> SkipReason | None:
        if y is None:
            return SkipReason.NO_LABEL
        if index in self._items:
            raise ConfigError(
                f"item {index} is already in flight: expected a new item number, got one in use; give every "
                "arrival its own index (or let the clock number them)"
            )
        if self.feeder is not None:
            self.counters.skipped[SkipReason.EVICTED.value] += self.feeder.offer(index, x, y)
            return None
        n = index % self.plan.num_workers
        if not self.plan.workers[n].live:
            return SkipReason.WORKER_REMOVED
        m = self.counters.admitted[n]
        lowest = self.rules.lowest_backprop_stage(n, m)
        if lowest is None:
            self.counters.admitted[n] += 1
            return SkipReason.OMITTED
        if not (self.scheduler.can_admit(n) if admit is None else admit(n)):
            return SkipReason.BUSY
        self.counters.admitted[n] += 1
        self._start_step(index, n, lowest, Batch.single(x, y))
        return None

    def _start_step(self, index: int, worker: int, lowest: int, new: Batch) -> None:
        """Let the algorithm turn the admitted samples into a step and queue it at worker's stage 0."""
        step: TrainingStep = self.algorithm.step(new)
        p = self.num_stages
        target = on_device(step.batch.y, self._devices[-1])
        item = InFlightItem(
            index, worker, lowest, target, [None] * p, [None] * p, [None] * p, [None] * p,
            loss=step.loss, samples=step.samples, shape=step.shape, held=step.batch.held,
        )
        item.inputs[0] = on_device(step.batch.x, self._devices[0])
        if self.meter is not None:
            self._unstarted_keys[index] = tuple(storage_keys(item.tensors()))
        self._items[index] = item
        self.scheduler.admit(worker, index, lowest)

    def pull(self) -> tuple[int, ...]:
        """A buffering method's turn: when its feeder has a mini-batch and the (one) trainer is free, draw
        it, count the buffered items it left as ``not_selected`` and start it; returns the workers that got
        a step (``()`` for every other method)."""
        feeder = self.feeder
        if feeder is None:
            return ()
        with self.lock:
            if not feeder.ready() or not self.scheduler.can_admit(0):
                return ()
            lowest = self.rules.lowest_backprop_stage(0, self.counters.admitted[0])
            if lowest is None:
                raise ConfigError(
                    f"a buffering method's plan must back-propagate every step, got one that omits step "
                    f"{self.counters.admitted[0]} (T3); give it a plan without omission"
                )
            fed = feeder.take()
            self.counters.skipped[SkipReason.NOT_SELECTED.value] += fed.not_selected
            self.counters.admitted[0] += 1
            self._start_step(fed.index, 0, lowest, fed.batch)
            return (0,)

    def finish_stream(self) -> None:
        """The stream has ended: what a buffering method still holds is skipped as ``stream_end``."""
        if self.feeder is not None:
            with self.lock:
                self.counters.skipped[SkipReason.STREAM_END.value] += self.feeder.drop_all()

    def step_shape(self, item: int) -> StepShape:
        """The virtual-clock cost of in-flight item ``item``'s step."""
        return self._items[item].shape

    # ------------------------------------------------------------------------------------- execution
    def execute(self, action: Action, stamps: Stamps) -> None:
        """Run ``action`` (really: its forward, or its recompute, backward and maybe update). When it raises,
        :attr:`failed_item` names its item (a caller blames that item's input, not a later arrival)."""
        self._unstarted_keys.pop(action.item, None)  # its tensors change from here on: walked at each sample
        try:
            self._run(action, stamps)
        except BaseException:
            if self.failed_item is None:
                self.failed_item = action.item
            raise

    def _run(self, action: Action, stamps: Stamps) -> None:
        """Dispatch ``action`` by kind (subclasses running more kinds override this, not :meth:`execute`)."""
        if action.kind is Kind.F:
            self._forward(action, stamps)
        elif action.kind is Kind.B:
            self._backward(action, stamps)
        else:
            raise ScheduleError(
                f"{action}: this pipeline's executors run F and B actions, got {action.kind.value}; a schedule "
                "with W actions (split backward) runs on a FlushPipeline"
            )

    def _forward(self, a: Action, stamps: Stamps) -> None:
        n, j = a.worker, a.stage
        item = self._items[a.item]
        t0 = stamps.start()
        x = item.inputs[j]
        if x is None:
            raise ScheduleError(
                f"{a} on executor {n}/{j}: expected the item's input from its F at stage {j - 1}, got none; the "
                "scheduler started F before its dependency (a bug)"
            )
        version = self.store.replica(n, j)
        runner = self._runners[(n, j)]
        x = on_device(x, self._devices[j])
        if j >= item.lowest:
            item.stashes[j] = version
            if self.plan.workers[n].recompute:
                out = forward_no_grad(runner, version, x)
                item.inputs[j] = x
            else:
                item.inputs[j] = None
                with self._saving():
                    graph = forward_with_grad(runner, version, x, input_grad=j > item.lowest)
                item.graphs[j] = graph
                out = graph.output.detach()
        else:
            item.inputs[j] = None
            out = forward_no_grad(runner, version, x)
        if j + 1 < self.num_stages:
            item.inputs[j + 1] = out
        del x, out
        self.end_of_action()
        with self.lock:
            self.counters.forwards[n][j] += 1
            self._record(Kind.F, a, version.version, None, t0, stamps.end())
            self._sample()

    def _backward(self, a: Action, stamps: Stamps) -> None:
        n, j = a.worker, a.stage
        item = self._items[a.item]
        t0 = stamps.start()
        version = item.stashes[j]
        if version is None:
            raise ScheduleError(
                f"{a} on executor {n}/{j}: expected the stash of the item's F at stage {j}, got none; the "
                "scheduler started B before that F (a bug)"
            )
        input_grad = j > item.lowest
        if self.plan.workers[n].recompute:
            t0 = self._recompute(a, item, version, stamps, t0)
        graph_ = item.graphs[j]
        if graph_ is None:
            raise ScheduleError(
                f"{a} on executor {n}/{j}: expected the forward graph of the item's F at stage {j}, got none "
                "(freed or never built); each B runs once after its F (a bug)"
            )
        item.graphs[j] = None
        if j == self.num_stages - 1:
            if item.held:  # rows a buffer keeps: which of them to blame if the step turns out non-finite
                item.bad_rows = ~torch.isfinite(graph_.output.detach()).flatten(1).all(dim=1).cpu()
            grads, grad_in = backward(graph_, loss=item.loss) if item.loss else backward(graph_, target=item.target)
        else:
            grad_out = item.grad_outputs[j]
            if grad_out is None:
                raise ScheduleError(
                    f"{a} on executor {n}/{j}: expected the output gradient from B at stage {j + 1}, got none; "
                    "the scheduler started B before its dependency (a bug)"
                )
            item.grad_outputs[j] = None
            grads, grad_in = backward(graph_, grad_output=grad_out.to(self._devices[j], non_blocking=True))
            del grad_out
        del graph_
        item.stashes[j] = None
        if input_grad:
            item.grad_outputs[j - 1] = grad_in
        del grad_in
        read = version.version
        with self.updater.locks[j]:
            self._offer_gradient(a, grads, version)
            del grads, version  # the stash is released here: the buffer holds the compensated gradient
            self.end_of_action()
            t_end = stamps.end()
            with self.lock:
                self.counters.backwards[n][j] += 1
                self._record(Kind.B, a, read, None, t0, t_end)
                self._sample()
                self._items_at_gradient_sample = self.counters.items  # see _update_sample_dominated
        self._after_gradient(a, stamps, t_end)
        if j == item.lowest:
            self._finish_item(item)

    def _recompute(self, a: Action, item: InFlightItem, version: StageVersion, stamps: Stamps, t0: float) -> float:
        """T1 before the first backward action of a stage: rebuild the graph on the stash from the kept
        stage input; returns when R ended (B's start)."""
        n, j = a.worker, a.stage
        x = item.inputs[j]
        if x is None:
            raise ScheduleError(
                f"{a} on executor {n}/{j}: expected the stage input kept for recomputation (T1), got none; "
                "each stage recomputes once, before its first backward action (a bug)"
            )
        with self._saving():
            item.graphs[j] = forward_with_grad(self._runners[(n, j)], version, x, input_grad=j > item.lowest)
        item.inputs[j] = None
        del x
        self.end_of_action()
        t_split = stamps.split()
        with self.lock:
            self.counters.recomputes[n][j] += 1
            self._record(Kind.R, a, version.version, None, t0, t_split)
            self._sample()
        return t_split

    def _offer_gradient(self, a: Action, grads: Sequence[Tensor], version: StageVersion) -> None:
        """Hand action ``a``'s parameter gradients to the updater (:meth:`StageUpdater.offer`); one it does
        not keep (a non-finite loss or gradient) is counted against the item: it never reaches the weights.
        Every path that hands a gradient to an update goes through this (call under the stage's lock)."""
        if not self.updater.offer(a.worker, a.stage, grads, version):
            self._count_non_finite(a.item)

    def _invalidate_memory(self) -> None:
        """A compensator allocated state: the meter re-counts its stable sources at the next sample."""
        if self.meter is not None:
            with self.lock:
                self.meter.invalidate()

    def _after_gradient(self, a: Action, stamps: Stamps, t_end: float) -> None:
        """T2: update once the worker's buffer of the stage holds c^a_{n,j} gradients."""
        if self.updater.accumulated(a.worker, a.stage) >= self.plan.workers[a.worker].accumulation[a.stage]:
            with self.updater.locks[a.stage]:
                self._update(a, stamps, t_end)

    def _finish_item(self, item: InFlightItem) -> None:
        """The item's last action (its backward at its lowest back-propagated stage) is done; a step of
        a mini-batch counts each of its ``samples``; an item with a dropped gradient counts as skipped
        ``non_finite`` (already), not as trained."""
        with self.lock:
            del self._items[item.index]
            self._unstarted_keys.pop(item.index, None)
            if item.index in self._non_finite:
                self._non_finite.discard(item.index)
            else:
                self.counters.trained_any_stage += item.samples
                self.counters.trained += item.samples * int(item.lowest == 0)

    def _count_non_finite(self, index: int | None) -> None:
        """Count an item whose gradient was dropped as skipped ``non_finite``, once (``None``: an item
        no longer known, counted per dropped gradient)."""
        with self.lock:
            count = 1
            if index is not None:
                if index in self._non_finite:
                    return
                self._non_finite.add(index)
                item = self._items.get(index)
                count = item.samples if item is not None else 1  # a mini-batch step drops all its samples
                if item is not None:
                    _evict_blamed(item)
            self.counters.skipped[SkipReason.NON_FINITE.value] += count

    def _update(self, a: Action, stamps: Stamps, t0: float) -> None:
        """U: apply worker ``a.worker``'s buffer of stage ``a.stage`` to the master (:meth:`StageUpdater.update`),
        then count, trace and sample it (call under the stage's lock)."""
        n, j = a.worker, a.stage
        done = self.updater.update(n, j)
        self.end_of_action()
        with self.lock:
            c = self.counters
            c.updates[n][j] += 1
            c.add_staleness(j, done.stalenesses)
            self._record(Kind.U, a, done.read, done.written, t0, stamps.end())
            if self.meter is not None and not done.same_storages:
                self.meter.invalidate()
            if not self._update_sample_dominated(done.same_storages):
                self._sample()

    def _update_sample_dominated(self, same_storages: bool) -> bool:
        """Whether the memory held after this update is provably at most the B sample taken just before it,
        so the update's own sample can change neither the peak nor its breakdown and is not taken (it is one
        of a 1 × 1 item's three samples, ~30 µs of Python on the executor's thread, which holds the GIL the
        record path's thread waits for). Exactly when: the plan is one worker and one stage (no other
        executor changes what the sources hold), the method is plain (``vanilla``, no buffering feeder: no
        algorithm state changes at an update), the update was in place with a stateless optimizer and no
        cloned replicas (``same_storages``: every version and optimizer storage is the one the B sample
        counted, the compensator observed nothing), and no arrival was dispatched since that sample (the
        only other writer of the sources; checked under :attr:`lock`, where both count). Then the sources
        hold what the B sample counted minus the gradient the update consumed. Call under :attr:`lock`."""
        return same_storages and self._single_plain_worker and self._items_at_gradient_sample == self.counters.items

    # ------------------------------------------------------------------------------------ reporting
    def _record(self, kind: Kind, a: Action, read: int, written: int | None, start: float, end: float) -> None:
        if self.trace is not None:
            self.trace.append(TraceEvent(kind, a.worker, a.stage, a.item, read, written, start, end))

    def _saving(self) -> AbstractContextManager[None]:
        return self.meter.tracker.hooks() if self.meter is not None else nullcontext()

    def _sample(self) -> None:
        if self.meter is not None:
            self.meter.sample()

    def in_flight(self) -> int:
        return len(self._items)

    def mean_staleness(self) -> tuple[float, ...]:
        return self.counters.mean_staleness()

    def master_state(self) -> list[dict[str, Tensor]]:
        """Copies of the master's tensors by stage, keyed by the stage module's parameter and buffer names
        (copies: a version's storage is recycled once the version dies)."""
        out = []
        for program, version in zip(self.programs, self.masters(), strict=True):
            names = program.param_names + program.buffer_names
            out.append({k: t.detach().clone() for k, t in zip(names, version.tensors(), strict=True)})
        return out


def _evict_blamed(item: InFlightItem) -> None:
    """A dropped step's blamed samples leave the buffers that keep them (ER/MIR's reservoir, Camel's
    buffer), so no later step replays them: the rows whose output was non-finite at the last stage's B,
    or every row when that singles none out (all rows or none non-finite, or a drop before that B).
    Call under the pipeline's lock (the buffers change under it)."""
    bad = item.bad_rows
    rows: Sequence[int] = range(len(item.held))
    if bad is not None and bool(bad.any()) and not bool(bad.all()):
        rows = bad.nonzero().flatten().tolist()
    for row in rows:
        held = item.held[row]
        if held is not None:
            held.buffer.evict(held.slot, held.stamp)
