"""Executors as OS processes over a master in shared memory: the wall clock's schedule, run in parallel.

On a CPU, the thread executors of :mod:`ferret_core.engine.wall_clock` share one interpreter: Python's
GIL serialises their Python parts, so on a 2-core machine more threads trained *fewer* items than one.
Here each live (worker, stage) executor is a process (:mod:`ferret_core.engine.processes.executor`),
started from a forkserver that preloads torch (milliseconds per process instead of a fresh
interpreter's 1–2 s), and the caller's process is the **coordinator**:

* it predicts every arrival with the current master, read straight from shared memory under a pin
  (predictions never wait for training), and dispatches it with the same admission rule
  (:meth:`Scheduler.can_admit`, T3's alignment, T4's removed workers) as the other clocks;
* one router thread drives the same :class:`~ferret_core.schedule.scheduler.Scheduler`: it starts each
  executor's next action by sending it down that executor's pipe, records the executor's answer as the
  trace events the validator reads (:func:`ferret_core.engine.trace.validate_trace`), and starts the next;
* the master's versions live in shared slots with reader counts (:mod:`.slots`): weight stashing,
  replicas refreshed at a worker's own update points and out-of-place updates, as on the other clocks;
* where the compensator walks the master's deltas (Alg. 1: ``iter-fisher``, ``iter-fisher-cf``), each
  stage that can be stale has one delta ring in shared memory (:mod:`.deltas`), sized to the stage's
  staleness bound: the updater pushes θ_new − θ_old, every executor of the stage compensates from it;
  where it folds them into a running average (``gap-aware``'s average step C and its count n), each such
  stage has one C and n in shared memory (:mod:`.average`): the updater folds θ_new − θ_old into them,
  every executor of the stage divides its stale gradients by the gap they give;
* with several stages, a worker's stage executors are ranks of one gloo process group (rendezvous through
  a file store on one host) and pass activations forward and their gradients backward point to point,
  tagged by item; the coordinator only says which action runs next;
* over several hosts (``hosts=``, :mod:`.hosts`), each stage's master and executors live on the rank that
  owns it, the coordinator's messages travel over ``torch.distributed`` links, the executors meet through
  a TCP store, and predictions read a follower copy of every remote stage's master.

**What runs here today.** Any plan's N workers × P stages on one host's CPUs or over several hosts' CPUs,
T1–T4 included, with every registered compensator. Refused with
:class:`~ferret_core.errors.NotImplementedFeatureError` (run them on the wall clock): buffering methods,
flushing schedules and instant methods (and a compensator that would fold every master update into state
of its own that is neither a delta ring nor a running average: none of the registered ones); the engine has
no OCL algorithm or SGD momentum option here (vanilla, plain SGD). Each executor builds its own
compensator, and what the thread engine's one compensator per stage keeps is shared per stage: what is folded
from the master's updates (Alg. 1's deltas, :mod:`.deltas`; Gap-Aware's C and n, :mod:`.average`) and what
is learnt from the gradients (Iter-Fisher's λ, v_r, v_a; DC-ASGD-a's mean square: :mod:`.tuning`), so every
compensator compensates as the thread engine's on the same sequence of updates and gradients (the state
restarts with a new clock unless its owner loads one: :meth:`ProcessClock.load_compensator_states`); only
statistics are per executor. The delta rings hold the plan's bound, which
this clock does not enforce: a staler gradient is compensated with the most recent deltas and counted as truncated
(:meth:`ProcessClock.compensations`). A script that starts process executors needs the ``if __name__ ==
"__main__":`` guard (the forkserver imports the main module by path, as torch's DataLoader workers do).

**Memory.** The shared version slots, delta rings, average steps and tuning states are counted once
(:meth:`ProcessClock.shared_bytes`); each executor measures the tensors it holds in its own process after
every action (its items' inputs, outputs and saved tensors, sends, gradient buffer, compensator state:
:mod:`.executor`) and reports its peak with every answer. :meth:`ProcessClock.measured_bytes` is the
shared bytes plus the executors' peaks: an upper bound of what the plan's tensors occupy at once, which
the byte model's ``MemorySettings(executors="processes")`` bounds in turn
(``tests/integration/test_process_memory.py``).

**Failures.** The first exception in an executor (sent with its traceback) or an executor process that
dies (a signal, the OOM killer) stops every executor within the router's next wake-up and is raised in
the caller by the next :meth:`submit`, :meth:`drain` or :meth:`close`, naming the worker and, where it
knows it, the item; executors also exit when the coordinator's process is gone (their pipe closes).

:class:`ProcessClock` is the facade over the parts, each owning its own state:

- the executor processes (:mod:`.pool`): their pipes and processes, retiring them, stopping them, and
  the clock's first failure (which kills them);
- the router (:mod:`.router`): the thread that reads the executors' answers, sends their next actions
  and watches their sentinels;
- the reports (:mod:`.reports`): the executors' measured peaks and their answers to the clock's
  questions (usage, compensations);
- the predictions (:mod:`.predictions`): the current master read under a pin.
"""

from __future__ import annotations

import itertools
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch.multiprocessing as tmp
from torch import Tensor, nn

from ferret_core.compensation import StageCompensator
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.dispatch import Dispatch, Executor
from ferret_core.engine.processes.executor import PRELOAD, START_METHOD, ExecutorSpec, start_executor
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.processes.pool import ExecutorPool
from ferret_core.engine.processes.predictions import MasterPredictions
from ferret_core.engine.processes.reports import ClockReports
from ferret_core.engine.processes.router import Router
from ferret_core.engine.processes.settings import (
    CompensationReport,
    ProcessSettings,
    ProcessUsage,
    check_supported,
    shares_average,
    shares_deltas,
)
from ferret_core.engine.processes.slots import SharedStageVersions, slots_needed, stage_versions
from ferret_core.engine.processes.stage_state import CompensatorSpec, load_state, read_state, stage_view
from ferret_core.engine.processes.tuning import SharedTuning, StageTunings
from ferret_core.engine.result import EngineStats
from ferret_core.engine.stage_exec import build_stages, unit_state
from ferret_core.engine.state import Counters
from ferret_core.engine.trace import plan_bounds, validate_trace
from ferret_core.engine.wall_clock import Arrival, ClockStopped
from ferret_core.errors import ConfigError, NotImplementedFeatureError, ScheduleError
from ferret_core.metrics import OnlineAccuracy
from ferret_core.plan import Plan
from ferret_core.schedule.actions import TraceEvent
from ferret_core.schedule.scheduler import Scheduler
from ferret_core.staleness import ring_capacity


class ProcessClock:
    """Drives a plan's live (worker, stage) executors as processes (see the module docstring).

    >>> with ProcessClock(units, setup, ProcessSettings(lr=0.02)) as clock:   # doctest: +SKIP
    ...     outcome = clock.submit(x, y)           # predicted now; trained by a worker process
    ...     clock.drain()
    """

    def __init__(
        self,
        units: Sequence[nn.Module],
        setup: PolicySetup,
        settings: ProcessSettings | None = None,
        *,
        hosts: Hosts | None = None,
    ) -> None:
        self.settings = s = settings or ProcessSettings()
        plan = setup.plan
        check_supported(setup, s)
        self.hosts = hosts  # several hosts: which rank owns each stage (:mod:`.hosts`); None: this host owns all
        if hosts is not None:
            hosts.check(plan.num_stages)
        self.dispatch = Dispatch(plan, setup.rules, keep_trace=s.keep_trace, queue_slots=s.queue_slots)
        recomputes = any(w.recompute for w in plan.workers)
        programs, initial = build_stages(units, plan.partition, allow_stochastic=not recomputes)
        self._programs = programs
        self._initial = initial
        self._counter = itertools.count()
        self._started = False
        self._shares_deltas = shares_deltas(s)
        self._shares_average = shares_average(s)
        self.deltas: list[SharedDeltas | None] = []  # per stage: its shared delta ring (Alg. 1), if any
        self.averages: list[SharedStepAverage | None] = []  # per stage: its shared average step (Gap-Aware), if any
        # per local stage: its shared tuning state (λ and the EMAs, or a mean square), built at the stage's
        # first executor that keeps one (:mod:`.tuning`)
        self.tunings = StageTunings()
        self._live = [w.index for w in plan.workers if w.live]
        self._executors = [(n, j) for n in self._live for j in range(plan.num_stages)]  # rank order
        self.stages: list[SharedStageVersions] = []
        self._store: str | None = None  # the executors' gloo rendezvous file (several stages, one host)
        self._store_address: tuple[str, int, str] | None = None  # the TCP store's (several hosts)
        # per stage, where the compensator shares what it keeps of the master's updates (a delta ring of this
        # many deltas, or an average step): the first plan's staleness bound, as allocated (0: none)
        self._shared_bounds: list[int] = []
        self._slot_workers = 0  # live workers the version slots are sized for (start())
        self._ctx: Any = None
        self.replans = 0
        self.start_seconds = math.nan  # start() to every executor ready
        # the parts, each owning its state (module docstring): 1. the executor processes and the first failure
        self._pool = ExecutorPool()
        self._lock = self._pool.cv
        # 2. the executors' peaks and answers, 3. the router over both, 4. predictions on the master
        self._reports = ClockReports(self._pool, self.shared_bytes)
        self._router = Router(self._pool, self.dispatch, self._reports)
        self._predictions = MasterPredictions(programs, self.dispatch, hosts, s.top_k)

    @property
    def failed_item(self) -> int | None:
        """The item an executor's error named (None: no executor failed on an item)."""
        return self._pool.failed_item

    @property
    def _processes(self) -> dict[Executor, Any]:
        """The live executors' processes by (worker, stage) (tests read their pids)."""
        return self._pool.processes

    @property
    def plan(self) -> Plan:
        """The plan in force (the last :meth:`replan`'s)."""
        return self.dispatch.plan

    @property
    def counters(self) -> Counters:
        return self.dispatch.counters

    @property
    def scheduler(self) -> Scheduler:
        return self.dispatch.scheduler

    @property
    def online(self) -> OnlineAccuracy:
        return self.dispatch.online

    @property
    def trace(self) -> list[TraceEvent] | None:
        return self.dispatch.trace

    # ------------------------------------------------------------------------------------ lifecycle
    def start(self) -> ProcessClock:
        if self._started:
            raise ScheduleError("the process clock is already started")
        t0 = time.perf_counter()
        ctx: Any = tmp.get_context(START_METHOD)
        ctx.set_forkserver_preload(PRELOAD)
        self._ctx = ctx
        # slots for the live workers (what the byte model counts): a re-plan may keep or remove workers on
        # these processes, one that brings more back needs a new clock
        self._slot_workers = len(self._live)
        p = self.plan.num_stages
        # the shared delta rings, sized to each stage's staleness bound, or the shared average steps (none
        # where the bound is 0: no gradient there is stale under the plan), kept as allocated through re-plans
        shared = self._shares_deltas or self._shares_average
        self._shared_bounds = [ring_capacity(self.plan, j) if shared else 0 for j in range(p)]
        hosts = self.hosts
        if hosts is None:
            self.stages = stage_versions(self._initial, self._slot_workers, ctx.Lock)
        else:  # this host's stages here; a follower copy of every other (its owner holds its slots)
            slots = [slots_needed(self._slot_workers, p, j) for j in range(p)]
            rings = self._shared_bounds if self._shares_deltas else [0] * p
            averaged = [size > 0 and self._shares_average for size in self._shared_bounds]
            followers = hosts.setup(self._initial, slots, rings, averaged, ctx.Lock)
            self.stages = [
                followers[j] if hosts.remote(j) else SharedStageVersions(v, slots[j], ctx.Lock(), ctx.Lock())
                for j, v in enumerate(self._initial)
            ]
            host, port = hosts.store_address()
            self._store_address = (host, port, f"clock-{os.getpid()}-{time.monotonic_ns()}/")
        for stage in self.stages:
            stage.watch(lambda: self._pool.error is not None)
        self.deltas = [
            SharedDeltas(j, self._initial[j].params, size)
            if size > 0 and self._local(j) and self._shares_deltas
            else None
            for j, size in enumerate(self._shared_bounds)
        ]
        self.averages = [
            SharedStepAverage(j, self._initial[j].params)
            if size > 0 and self._local(j) and self._shares_average
            else None
            for j, size in enumerate(self._shared_bounds)
        ]
        if p > 1 and hosts is None:
            self._store = tempfile.mkdtemp(prefix="ferret-gloo-")
        for executor in self._executors:
            self._spawn(executor)
        self._started = True
        self._router.start()
        self.dispatch.origin = t0
        self.start_seconds = time.perf_counter() - t0
        return self

    def _spawn(self, executor: Executor) -> None:
        """Start executor (worker, stage) as a process, its replica pinned at the current master."""
        n, j = executor
        s = self.settings
        p = self.plan.num_stages
        rank = {e: r for r, e in enumerate(self._executors)}
        worker = self.plan.workers[n]
        spec = ExecutorSpec(
            worker=n,
            stage=j,
            num_stages=p,
            program=self._programs[j],
            # the worker's first replica: the current master (a remote stage's host pins it there)
            replica=self.stages[j].pin_current() if self._local(j) else (-1, -1),
            accumulation=worker.accumulation[j],
            recompute=worker.recompute,
            lr=s.lr,
            compensator=s.compensator,
            compensator_settings=s.compensator_settings,
            ring_capacity=self._ring_capacity(j),
            threads=s.threads,
            flush_denormal=s.flush_denormal,
            retain_heap=s.retain_heap,
            rank=rank[executor],
            world_size=len(self._executors) if p > 1 else 1,
            store=None if self._store is None else os.path.join(self._store, "store"),
            store_address=self._store_address,
            prev_rank=rank.get((n, j - 1)),
            next_rank=rank.get((n, j + 1)),
            max_step_ratio=s.max_step_ratio,
            record_compensations=s.record_compensations,
            measure_memory=s.measure_memory,
            received=self.dispatch.received(n, j),
        )
        if self.hosts is not None and not self._local(j):
            self._pool.add(executor, *self.hosts.spawn(spec))
            return
        shared = (self.deltas[j], self.averages[j], self._tuning(j))
        self._pool.add(executor, *start_executor(self._ctx, spec, self.stages[j], *shared))

    def _tuning(self, stage: int) -> SharedTuning | None:
        """``stage``'s shared tuning state (built at its first executor that keeps one), else None."""
        s = self.settings
        params = self._initial[stage].params
        return self.tunings.get(stage, params, s.compensator, s.compensator_settings, self._ring_capacity(stage))

    def _ring_capacity(self, stage: int) -> int:
        """The ``ring_capacity`` an executor's compensator is built with: the shared ring's where the
        compensator walks the master's deltas, the first plan's staleness bound where it folds them into
        a shared average (0 at a stage without either: a re-plan keeps them as allocated), else the plan's
        staleness bound (which also says whether the stage can be stale)."""
        if self._shares_deltas or self._shares_average:
            return self._shared_bounds[stage]
        return ring_capacity(self.plan, stage)

    def _local(self, stage: int) -> bool:
        """Whether ``stage``'s master (its slots, ring and executors) lives on this host."""
        return self.hosts is None or not self.hosts.remote(stage)

    def replan(self, setup: PolicySetup, timeout: float = 60.0, *, queue_slots: int | None = None) -> float:
        """Run ``setup``'s plan from here on, keeping the executor processes: drain (every admitted item
        finishes; none is lost), retire the executors of workers the plan removes (T4), start those of
        workers it brings back, and send every kept executor its new T1/T2 settings; the versions, the
        counters and each worker's item count (T3's alignment) carry over. Returns the seconds from the
        drained pipeline to the new plan in force. The plan must keep the partition and the worker slots
        (N, the dispatch modulus), and no more live workers than the version slots were sized for; with
        several stages it must also keep the live workers (their gloo group stays as it is). Otherwise
        build a new clock. ``queue_slots``: the new plan's admission queue K (None: the settings'). The shared
        delta rings stay as they were allocated for the first plan (a plan whose staleness bound is larger
        has its staler gradients compensated with the deltas the ring holds, counted as truncated); so do
        the shared average steps, which keep what they folded (a stage that had none under the first plan
        applies its stale gradients as they are, counted as truncated)."""
        plan = setup.plan
        check_supported(setup, self.settings)
        if plan.partition != self.plan.partition or plan.num_workers != self.plan.num_workers:
            raise ConfigError(
                f"a re-plan on the running executors keeps the partition {self.plan.partition.boundaries} and the "
                f"{self.plan.num_workers} worker slots, got {plan.partition.boundaries} and {plan.num_workers}; "
                "close this clock and start one for the new plan"
            )
        live = [w.index for w in plan.workers if w.live]
        if len(live) > self._slot_workers:
            raise ConfigError(
                f"this clock's version slots hold {self._slot_workers} live worker(s), the plan has {len(live)}; "
                "close this clock and start one for the new plan"
            )
        if plan.num_stages > 1 and live != self._live:
            raise NotImplementedFeatureError(
                f"re-planning live workers {self._live} → {live} over {plan.num_stages} stages would re-form the "
                "executors' gloo group, which is not built; close this clock and start one for the new plan"
            )
        self.drain(timeout)
        t0 = time.perf_counter()
        pool = self._pool
        with self._lock:
            pool.raise_if_failed()
            gone = [e for e in self._executors if e[0] not in live]
            for executor in gone:
                pool.retire(executor)
            self.dispatch.replan(plan, setup.rules)
            self.dispatch.queue_slots = self.settings.queue_slots if queue_slots is None else queue_slots
            self._live = live
            self._executors = [(n, j) for n in live for j in range(plan.num_stages)]
            for executor in self._executors:
                n, j = executor
                if executor in pool.conns:
                    worker = plan.workers[n]
                    pool.send(executor, ("configure", worker.accumulation[j], worker.recompute))
                else:
                    self._spawn(executor)
            self.replans += 1
        self._router.wake()  # the router waits on the new executors too
        for executor in gone:
            pool.join_retired(executor)
        return time.perf_counter() - t0

    def close(self, *, reraise: bool = True) -> None:
        """Stop every executor (items in flight are abandoned; :meth:`drain` first to finish them) and
        raise an executor's failure unless ``reraise`` is false."""
        self._pool.begin_stop()
        self._router.stop()
        self._pool.close_dead()
        self._pool.stop()
        if self.hosts is not None and self._started:
            self.hosts.teardown()
        if self._store is not None:
            shutil.rmtree(self._store, ignore_errors=True)
            self._store = None
        self._started = False
        if reraise:
            self._pool.raise_if_failed()

    def __enter__(self) -> ProcessClock:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(reraise=exc_type is None)

    # ------------------------------------------------------------------------------------- arrivals
    def submit(self, x: Tensor, y: int | None, *, index: int | None = None) -> Arrival:
        """Predict one arrival (a sample without batch dimension) with the current master, on the caller's
        thread, and dispatch it: admitted to worker i mod N, or skipped with the reason."""
        return self.submit_many([x], [y], None if index is None else [index])[0]

    def submit_many(
        self, xs: Sequence[Tensor], ys: Sequence[int | None], indices: Sequence[int] | None = None
    ) -> list[Arrival]:
        """Arrivals that came together (a consumer batch): predicted in one forward pass on one master
        version, then dispatched one by one in order (what the wall clock does with a queued backlog)."""
        if len(xs) != len(ys) or (indices is not None and len(indices) != len(xs)):
            raise ConfigError(f"submit_many needs as many labels and indices as samples, got {len(xs)} samples")
        with self._lock:
            self._pool.raise_if_failed()
            if self._pool.stopping or not self._started:
                raise ClockStopped("the process clock is not running: start() it (or it was closed)")
        numbers = [next(self._counter) for _ in xs] if indices is None else list(indices)
        try:
            tops, version = self._predictions.predict(self.stages, xs)
        except ScheduleError:
            with self._lock:
                self._pool.raise_if_failed()  # the executor failure that stopped the clock, not its symptom
            raise
        arrivals = []
        with self._lock:
            for i, x, y, top in zip(numbers, xs, ys, tops, strict=True):
                prediction, confidence = top[0]
                reason, worker = self.dispatch.admit(i, x, y, prediction)
                if worker is not None:
                    self._router.kick(worker, 0)
                arrivals.append(Arrival(i, prediction, reason, confidence, worker, tuple(top), version))
        return arrivals

    def run_stream(self, items: Iterable[tuple[Tensor, int | None]], arrival_interval: float) -> None:
        """Submit ``items`` every ``arrival_interval`` seconds (paced on the wall clock), then drain."""
        t0 = time.perf_counter()
        for k, (x, y) in enumerate(items):
            delay = t0 + k * arrival_interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            self.submit(x, y)
        self.drain()

    def drain(self, timeout: float | None = None) -> None:
        """Wait until every admitted item has finished (raises an executor's failure)."""
        deadline = None if timeout is None else time.perf_counter() + timeout
        with self._lock:
            while not self.scheduler.idle() and self._pool.error is None:
                left = None if deadline is None else deadline - time.perf_counter()
                if left is not None and left <= 0:
                    raise ScheduleError(f"drain timed out after {timeout} s with items in flight")
                self._lock.wait(left)
            self._pool.raise_if_failed()

    # ------------------------------------------------------------------------------------ reporting
    def compensator_states(self, timeout: float = 10.0) -> list[dict[str, Any]]:
        """Per stage, what its executors' compensators share, as one compensator's ``state_dict()`` (the
        thread engine's format: Alg. 1's ring, Gap-Aware's C and n, λ and the EMAs or DC-ASGD-a's mean
        square; the statistics, kept per executor, are zeros here): what a snapshot keeps and what a new
        clock carries on (:func:`~ferret_core.engine.carry.carry_compensator_states`). Call it drained. A
        stage another host owns is read there (:meth:`Hosts.compensator_states`). Raises
        :class:`ScheduleError` when a stage's update lock is not free within ``timeout`` seconds (an executor
        killed inside its update never releases it)."""
        remote = {j: self._compensator_spec(j) for j in range(self.plan.num_stages) if not self._local(j)}
        states = {} if self.hosts is None or not remote else self.hosts.compensator_states(remote, timeout)
        for j in range(self.plan.num_stages):
            if j not in remote:
                states[j] = read_state(self._stage_compensator(j), self.stages[j].update_lock, j, timeout)
        return [states[j] for j in range(self.plan.num_stages)]

    def load_compensator_states(self, states: Sequence[Mapping[str, Any]], timeout: float = 10.0) -> None:
        """Write ``states`` (:meth:`compensator_states`' format, one per stage of this plan) into the stages'
        shared memory, drained, on whichever host owns each: the tuning state and Gap-Aware's C and n;
        Alg. 1's ring keeps what this clock pushed (its deltas are of this clock's versions). Raises
        :class:`ScheduleError` as :meth:`compensator_states` does."""
        if len(states) != self.plan.num_stages:
            raise ConfigError(
                f"compensator states for {len(states)} stages, this plan has {self.plan.num_stages}; carry them "
                "to this plan first (ferret_core.engine.carry.carry_compensator_states)"
            )
        remote = {j: (self._compensator_spec(j), dict(s)) for j, s in enumerate(states) if not self._local(j)}
        if remote and self.hosts is not None:
            self.hosts.load_compensator_states(remote, timeout)
        for j, state in enumerate(states):
            if j not in remote:  # its own empty ring takes the state's ring, unread
                load_state(self._stage_compensator(j, ring=False), self.stages[j].update_lock, j, state, timeout)

    def _compensator_spec(self, stage: int) -> CompensatorSpec:
        """How ``stage``'s executors build their compensator (what a view of its state is built with)."""
        s = self.settings
        return CompensatorSpec(s.compensator, s.compensator_settings, self._ring_capacity(stage))

    def _stage_compensator(self, stage: int, *, ring: bool = True) -> StageCompensator:
        """A compensator of ``stage``, a stage of this host, over the state its executors share
        (:func:`stage_view`); without ``ring``, over a ring of its own (empty) instead of the stage's shared one."""
        return stage_view(self._compensator_spec(stage), self._initial[stage].params, deltas=self.deltas[stage],
                          average=self.averages[stage], tuning=self._tuning(stage), ring=ring)  # fmt: skip

    def master_state(self) -> list[dict[str, Tensor]]:
        """Copies of the current master's tensors by stage, keyed by the stage module's parameter and
        buffer names (as :meth:`Pipeline.master_state`). Over several hosts the followers are first brought
        up to their owners' masters (call drained)."""
        if self.hosts is not None:
            self.hosts.sync()
        out = []
        for program, stage in zip(self._programs, self.stages, strict=True):
            tensors = [*stage.copy_current(), *(b.clone() for b in stage.buffers)]
            out.append(dict(zip(program.param_names + program.buffer_names, tensors, strict=True)))
        return out

    def unit_state(self) -> dict[tuple[int, str], Tensor]:
        """:meth:`master_state` keyed by (unit index in the model, tensor name inside the unit), as
        :meth:`StreamEngine.unit_state`: what the model's units hold once the master is copied into them."""
        return unit_state(self.plan.partition, self.master_state())

    def updates(self) -> int:
        """Optimizer updates applied so far, over stages and workers."""
        with self._lock:
            return sum(sum(row) for row in self.counters.updates)

    def stats(self) -> EngineStats:
        """Counters so far, read under the clock's lock (as :meth:`StreamEngine.stats`). ``peak_bytes`` is
        :meth:`measured_bytes`: the shared segments plus every executor's measured peak."""
        with self._lock:
            return self.counters.engine_stats(
                in_flight=self.scheduler.in_flight_items(),
                peak_bytes=self.measured_bytes(),
                staleness_bound=plan_bounds(self.plan),
            )

    def set_queue_slots(self, slots: int | None) -> None:
        """Items that may wait per worker from now on (None: the rules' wait_slots)."""
        if slots is not None and slots < 0:
            raise ConfigError(f"queue_slots must be >= 0 (or None), got {slots}")
        with self._lock:
            self.dispatch.queue_slots = slots

    def measured_service_times(self) -> tuple[float | None, ...]:
        """Per worker, its executors' measured busy seconds per item at its slowest stage (None until a
        window of items was measured), as :meth:`WallClock.measured_service_times`."""
        with self._lock:
            return self.dispatch.measured_service_times()

    def shared_bytes(self) -> int:
        """Bytes of the shared version slots, delta rings, average steps and tuning states (each counted
        once, however many processes map it); over several hosts, every host's (and the coordinator's
        follower copies)."""
        rings = sum(d.nbytes() for d in self.deltas if d is not None)
        rings += sum(a.nbytes() for a in self.averages if a is not None)
        rings += self.tunings.nbytes()
        remote = 0 if self.hosts is None else self.hosts.shared_bytes()
        return sum(stage.nbytes() for stage in self.stages) + rings + remote

    def measured_host_bytes(self) -> tuple[int, ...]:
        """Over several hosts, :meth:`measured_bytes` by the host that holds it, rank 0 first: a remote rank's
        shared segments (as it reported them) and the peaks of the executors of the stages it owns; rank 0's
        own segments (its stages' slots, rings and average steps, and the follower copies of the others') and
        its executors' peaks. One host: ``(measured_bytes(),)``. The parts sum to :meth:`measured_bytes`;
        planned, they are :func:`ferret_core.planning.host_memory.host_bytes`."""
        if self.hosts is None:
            return (self.measured_bytes(),)
        out = [0] * self.hosts.world_size
        for rank, nbytes in self.hosts.shared_bytes_by_rank().items():
            out[rank] += nbytes
        out[self.hosts.rank] += self.shared_bytes() - self.hosts.shared_bytes()
        for (_, stage), peak in self.executor_bytes().items():
            out[self.hosts.owner(stage)] += peak
        return tuple(out)

    def executor_bytes(self) -> dict[Executor, int]:
        """Per executor (worker, stage), the peak bytes it measured in its own process so far (the tensors
        it held at a sample after an action, the shared segments excluded), as its last answer reported."""
        return self._reports.executor_bytes()

    def measured_bytes(self) -> int:
        """The plan's measured peak: :meth:`shared_bytes` plus every executor's peak (:meth:`executor_bytes`),
        an upper bound of the bytes all of them held at once (:meth:`.reports.ClockReports.measured_bytes`)."""
        return self._reports.measured_bytes()

    def usage(self, timeout: float = 5.0) -> list[ProcessUsage]:
        """CPU seconds, peak RSS and measured memory of every executor process (asked over their pipes;
        call drained)."""
        return self._reports.usage(timeout)

    def compensations(self, timeout: float = 5.0) -> list[CompensationReport]:
        """Every executor's compensator stats and recorded calls (``ProcessSettings.record_compensations``),
        asked over their pipes; call drained."""
        return self._reports.compensations(timeout)

    def ordered_trace(self) -> list[TraceEvent]:
        """The trace in the order its events ended (executors report concurrently; their stamps come from
        one monotonic clock, and an update's end is stamped under its stage's update lock, so versions
        appear in the order they were written)."""
        if self.trace is None:
            raise ScheduleError("the trace was not kept (ProcessSettings.keep_trace)")
        with self._lock:
            return sorted(self.trace, key=lambda e: (e.end, e.start))

    def validate(self) -> None:
        """Check the executed trace against the schedule's invariants (staleness is reported, not bounded:
        executors run when their inputs are ready, as on the wall clock). The validator reads one plan's
        trace from version 0: call it before a :meth:`replan`."""
        if self.replans:
            raise NotImplementedFeatureError(
                f"the trace spans {self.replans} re-plan(s); the validator reads one plan's trace from version 0: "
                "validate() before replan()"
            )
        validate_trace(self.ordered_trace(), self.plan, check_staleness=False)
