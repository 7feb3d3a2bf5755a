"""The streaming engine's facade: build a pipeline for a policy, run it on a clock, report a result.

>>> setup = Oracle().setup("mlp", len(units), arrival_interval=1.0)        # doctest: +SKIP
>>> engine = StreamEngine(units, setup, EngineSettings(lr=1e-3))          # doctest: +SKIP
>>> result = engine.run_virtual(stream, times, arrival_interval=1.0)      # doctest: +SKIP

:func:`simulate` does the three steps for a :class:`~ferret_core.engine.policies.Policy` and a profile.
:meth:`StreamEngine.run_wall` runs the same pipeline on real executors (:mod:`.wall_clock`), and
:meth:`StreamEngine.wall_clock` hands them out for a caller that pushes arrivals itself.
An engine is used for one run: its versions, counters and trace accumulate.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.admission import AdmissionSettings
from ferret_core.engine.carry import carry_compensator_states
from ferret_core.engine.memory_meter import MemoryMeter
from ferret_core.engine.optim import SGD, Optimizer
from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.policies import Policy, PolicySetup
from ferret_core.engine.result import EngineStats, SimulationResult
from ferret_core.engine.stage_exec import build_stages, unit_state
from ferret_core.engine.steps import Algorithm
from ferret_core.engine.trace import plan_bounds, validate_trace
from ferret_core.engine.versions import StageVersion
from ferret_core.engine.virtual_clock import Sample, VirtualClock
from ferret_core.engine.wall_clock import WallClock
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.profile import ModelProfile
from ferret_core.schedule.stage_times import StageTimes
from ferret_core.schedule.staleness_replay import replay_staleness
from ferret_core.staleness import ring_capacity

REPLAY_HORIZON = 2000  # arrivals replayed to size the delta rings (a stream of unknown length: this many)


@dataclass(frozen=True)
class EngineSettings:
    """Engine options. ``lr``/``momentum``: the master's SGD (DESIGN §3.11: plain SGD, lr 1e-3).
    ``compensator``: one of :data:`ferret_core.compensation.COMPENSATOR_NAMES`. ``measure_memory``:
    sample held bytes after every action. ``keep_trace``: keep every trace event (needed for
    validation and replay; a long-running trainer turns it off). ``clone_replicas``: physical replica
    copies (see :mod:`ferret_core.engine.versions`). ``validate``: check the executed trace at the end
    of a virtual run (staleness against the bound is reported, not enforced). ``score_online``: count
    online accuracy (the result's ``oacc``) as items are dispatched; a caller that scores predictions
    itself (the trainer service, which keeps one count across re-plans, restarts and late labels) turns
    it off, so every prediction is scored once. ``top_k``: how many of the most probable classes (with
    their probabilities) the wall clock's :class:`Arrival` reports (the trainer publishes them).
    ``max_step_ratio``: the norm guard, a bound on each SGD step relative to the stage's weight norm
    (:mod:`ferret_core.engine.step_guard`; None: unbounded)."""

    lr: float = 1e-3
    momentum: float = 0.0
    compensator: str = "none"
    compensator_settings: CompensatorSettings = field(default_factory=CompensatorSettings)
    measure_memory: bool = True
    keep_trace: bool = True
    clone_replicas: bool = False
    validate: bool = True
    score_online: bool = True
    top_k: int = 1
    max_step_ratio: float | None = None


class StreamEngine:
    """One policy's pipeline over a model given as its ordered units.

    An adapter (the trainer service) reads and drives the engine only through this class: the plan in
    force (:attr:`plan`, :attr:`planned`, :meth:`retarget`), the master's weights (:meth:`masters`,
    :meth:`unit_state`, :meth:`evaluate`), counters (:meth:`stats`, :meth:`updates`), the compensators'
    state, the item a failed action blames (:attr:`failed_item`) and a hook run after every action
    (``end_of_action``). ``pipeline`` and ``setup`` are the engine's own; tests of the engine read them."""

    def __init__(
        self,
        units: Sequence[nn.Module],
        setup: PolicySetup,
        settings: EngineSettings | None = None,
        *,
        devices: Sequence[torch.device] | None = None,
        optimizer: Optimizer | None = None,
        algorithm: Algorithm | None = None,
        end_of_action: Callable[[], None] | None = None,
    ) -> None:
        """``end_of_action``: called on the executing thread after each step an action runs (a forward, a
        recompute, a backward, an update: one call per trace event), before the next; an exception it
        raises fails that action as the action's own would (:attr:`failed_item` names its item). For a
        caller that injects faults into training (the trainer's ``trainer.mid-step`` failpoint). CPU
        stages only: on CUDA stages the wall clock puts its per-action device synchronization there
        instead."""
        self.setup = setup
        self.settings = settings or EngineSettings()
        plan = setup.plan
        s = self.settings
        meter = MemoryMeter({}) if s.measure_memory else None  # first: its CUDA baseline is the idle state
        recomputes = any(w.recompute for w in plan.workers if w.live)
        programs, initial = build_stages(units, plan.partition, devices, allow_stochastic=not recomputes)
        compensators = [
            make_compensator(s.compensator, v.params, s.compensator_settings, ring_capacity(plan, j))
            for j, v in enumerate(initial)
        ]
        pipeline_type = setup.pipeline_type or Pipeline
        self.pipeline = pipeline_type(
            plan,
            setup.rules,
            programs,
            initial,
            optimizer=optimizer or SGD(s.lr, s.momentum, s.max_step_ratio),
            compensators=compensators,
            meter=meter,
            clone_replicas=s.clone_replicas,
            keep_trace=s.keep_trace,
            score_online=s.score_online,
            algorithm=algorithm,
            feeder=setup.feeder,
            lr=s.lr,
            end_of_action=end_of_action,
        )
        if meter is not None:
            meter.sample()  # what an idle engine holds (weights, optimizer, compensators): never 0 bytes

    @property
    def plan(self) -> Plan:
        """The plan in force: the one the engine was built for, or the last :meth:`retarget`'s."""
        return self.setup.plan

    @property
    def planned(self) -> Plan | None:
        """The planner's plan whose predicted bytes are reported (``None``: the method plans no bytes)."""
        return self.setup.planned

    def can_retarget(self, plan: Plan) -> bool:
        """Whether the running pipeline already runs ``plan``: the same model, partition, workers
        (accumulation, liveness, recomputation), decay, profile stage times, dtype and memory model as
        the plan in force, so the same scheduler rules, staleness bounds and compensators. Such a plan
        differs only in the arrival interval and what the planner derives from it (R_F, predicted bytes),
        which the running pipeline does not read: :meth:`retarget` takes it without a rebuild."""
        old = self.setup.plan

        def shape(p: Plan) -> tuple[object, ...]:
            return (p.model, p.partition, p.workers, p.decay, p.stage_forward_time, p.stage_backward_time, p.dtype)

        return shape(plan) == shape(old) and plan.memory_model == old.memory_model

    def retarget(self, plan: Plan) -> None:
        """Make ``plan`` the plan in force, and the planned one, while the pipeline runs on undrained: a
        re-plan that only moved the stream's rate needs no drain and no rebuild (no pause).
        :attr:`plan`, :attr:`planned`, :meth:`stats` and :meth:`result` report ``plan`` from here on (its
        staleness bounds, its predicted bytes). Raises :class:`ConfigError` unless :meth:`can_retarget`:
        a plan that changes the pipeline needs a new engine."""
        if not self.can_retarget(plan):
            raise ConfigError("retarget takes a plan the running pipeline already runs (see can_retarget)")
        self.setup = dataclasses.replace(self.setup, plan=plan, planned=plan)

    @property
    def failed_item(self) -> int | None:
        """The item of the first action that raised (``None`` while none has): a caller blames that item's
        input for the failure, not the later arrival whose call reported it."""
        return self.pipeline.failed_item

    def masters(self) -> tuple[StageVersion, ...]:
        """The current master version of every stage, from any thread, without the pipeline lock (for
        predictions and inspection of the weights). Versions are immutable: read them, never write them;
        holding them keeps an update from overwriting them in place."""
        return self.pipeline.masters()

    def unit_state(self) -> dict[tuple[int, str], Tensor]:
        """Copies of the master's tensors (parameters and buffers), stage by stage, keyed by the unit's
        index in the model and the tensor's name inside the unit: what the model's units hold once the
        master is copied into them (snapshots, and the weights a rebuilt engine starts from). Take it
        drained for weights that reflect every dispatched item."""
        return unit_state(self.setup.plan.partition, self.pipeline.master_state())

    def evaluate(self, x: Tensor, y: Tensor) -> float:
        """Test accuracy (percent) of the current master on the labelled split ``x``, ``y``."""
        return self.pipeline.evaluate(x, y)

    def run_virtual(
        self,
        items: Iterable[Sample],
        times: StageTimes | None,
        arrival_interval: float,
        *,
        test: tuple[Tensor, Tensor] | None = None,
        on_arrival: Callable[[int], None] | None = None,
    ) -> SimulationResult:
        """Run ``items`` on the virtual clock with stage ``times`` (ignored, may be ``None``, for instant
        policies such as Oracle) and report."""
        if self.setup.instant:
            times = StageTimes.instant(self.pipeline.num_stages)
        if times is None:
            raise ConfigError(f"method {self.setup.method!r} needs stage times (StageTimes.from_profile)")
        self._fit_rings(items, times, arrival_interval)
        started = time.perf_counter()
        VirtualClock(self.pipeline, times, arrival_interval).run(items, on_arrival)
        elapsed = time.perf_counter() - started
        self._validate()
        return self.result(wall_seconds=elapsed, test=test)

    def _fit_rings(self, items: Iterable[Sample], times: StageTimes, arrival_interval: float) -> None:
        """Size the delta rings to the staleness this run's schedule reaches (a tensor-free replay of the
        virtual clock, :mod:`ferret_core.schedule.staleness_replay`), not to the plan's bound, which holds on
        any clock (1 stage × 5 workers: 4 deltas, not 8); a staler gradient still grows a ring up to the
        bound (counted as truncated). Only for the engine's own pipeline with single-item steps (the
        replay's model of the schedule) and before the first update; otherwise the rings keep the bound."""
        s, p = self.setup, self.pipeline
        if s.pipeline_type is not None or s.feeder is not None or p.algorithm.name != "vanilla" or p.counters.items:
            return
        count = min(len(items), REPLAY_HORIZON) if isinstance(items, Sized) else REPLAY_HORIZON
        reached = replay_staleness(s.plan, times, arrival_interval, count, s.rules)
        for j, compensator in enumerate(p.compensators):
            compensator.fit_ring(reached.compensated_max[j], ring_capacity(s.plan, j))

    def _validate(self) -> None:
        p = self.pipeline
        if self.settings.validate and p.trace is not None:
            validate_trace(p.trace, self.setup.plan, check_staleness=False, semantics=p.trace_semantics)

    def wall_clock(
        self,
        *,
        admission: AdmissionSettings | None = None,
        inline_predictions: bool = False,
        inline_training: bool = False,
    ) -> WallClock:
        """Real executors over this engine's pipeline (not started): ``submit`` arrivals, ``drain``,
        ``close`` — for the trainer service. ``admission``: admit arrivals submitted with an event time
        by event time (:mod:`ferret_core.engine.admission`). ``inline_predictions``: no prediction
        thread; whoever waits for an outcome predicts the queue (:meth:`WallClock.predict_queued`).
        ``inline_training``: no executor threads either; the caller trains (:meth:`WallClock.train_step`)."""
        return WallClock(
            self.pipeline,
            top_k=self.settings.top_k,
            admission=admission,
            inline_predictions=inline_predictions,
            inline_training=inline_training,
        )

    def run_wall(
        self,
        items: Iterable[Sample],
        arrival_interval: float,
        *,
        test: tuple[Tensor, Tensor] | None = None,
        on_arrival: Callable[[int], None] | None = None,
    ) -> SimulationResult:
        """Push ``items`` every ``arrival_interval`` seconds through real executors, drain, report."""
        clock = self.wall_clock()
        started = time.perf_counter()
        with clock:
            clock.run_stream(items, arrival_interval, on_arrival)
        elapsed = time.perf_counter() - started
        self._validate()
        return self.result(wall_seconds=elapsed, test=test)

    def stats(self) -> EngineStats:
        """Counters so far, cheap and consistent (read under the pipeline's lock): what an adapter reports
        while the engine runs, without reaching into the pipeline."""
        p = self.pipeline
        with p.lock:
            return p.counters.engine_stats(
                in_flight=p.in_flight(),
                peak_bytes=None if p.meter is None else p.meter.peak_bytes,
                staleness_bound=plan_bounds(self.setup.plan),
                compensations_truncated=tuple(comp.truncated for comp in p.compensators),
            )

    def updates(self) -> int:
        """Optimizer updates applied so far, over stages and workers (``stats().updates``, without the rest
        of :meth:`stats`: the trainer reads it once per prediction)."""
        p = self.pipeline
        with p.lock:
            return sum(sum(row) for row in p.counters.updates)

    def compensator_stats(self) -> list[dict[str, float]]:
        """Each stage's compensator statistics (λ, mean relative correction, calls; it synchronises with the
        device: call it off the hot path)."""
        return [comp.stats() for comp in self.pipeline.compensators]

    def compensator_state(self) -> list[dict[str, Any]]:
        """Per stage, the compensator's ``state_dict()`` (copies): for snapshots. Take it drained."""
        return self.pipeline.compensator_states()

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        """Restore :meth:`compensator_state` into an engine of the same plan and compensator (drained)."""
        self.pipeline.load_compensator_states(states)

    def carry_compensator_state(self, states: Sequence[Mapping[str, Any]], *, same_partition: bool) -> None:
        """Load what this (new, idle) engine's compensators can use of another plan's
        :meth:`compensator_state` (:mod:`ferret_core.engine.carry` says what carries and what restarts)."""
        fresh = self.pipeline.compensator_states()
        self.pipeline.load_compensator_states(carry_compensator_states(states, fresh, same_partition=same_partition))

    def result(self, *, wall_seconds: float, test: tuple[Tensor, Tensor] | None = None) -> SimulationResult:
        """The result so far (``tacc`` on ``test`` with the current master)."""
        p = self.pipeline
        c = p.counters
        stats = [comp.stats() for comp in p.compensators]
        meter = p.meter
        trace = p.trace
        return SimulationResult(
            method=self.setup.method,
            compensator=self.settings.compensator,
            algorithm=p.algorithm.name,
            oacc=p.online.get(),
            tacc=None if test is None else p.evaluate(*test),
            items=c.items,
            trained=c.trained,
            trained_any_stage=c.trained_any_stage,
            skipped=dict(c.skipped),
            updates_per_stage=c.updates_per_stage(),
            peak_bytes=None if meter is None else meter.peak_bytes,
            cuda_peak_bytes=None if meter is None else meter.cuda_peak_bytes(),
            planned_bytes=None if self.setup.planned is None else self.setup.planned.planned_bytes,
            memory_breakdown={} if meter is None else dict(meter.peak_breakdown),
            mean_staleness=p.mean_staleness(),
            max_staleness=tuple(c.staleness_max),
            staleness_histogram=tuple(dict(h) for h in c.staleness_histogram),
            staleness_bound=p.trace_semantics.bounds or plan_bounds(self.setup.plan),
            lambdas=tuple(s["lambda"] for s in stats),
            relative_correction=tuple(s["relative_correction_mean"] for s in stats),
            num_stages=p.num_stages,
            num_workers=self.setup.plan.num_workers,
            admitted=tuple(c.admitted),
            forwards=_grid(c.forwards),
            backwards=_grid(c.backwards),
            recomputes=_grid(c.recomputes),
            updates=_grid(c.updates),
            wall_seconds=wall_seconds,
            trace=None if trace is None else tuple(trace),
        )


def simulate(
    units: Sequence[nn.Module],
    policy: Policy,
    items: Iterable[Sample],
    *,
    model: str,
    profile: ModelProfile,
    arrival_interval: float,
    test: tuple[Tensor, Tensor] | None = None,
    settings: EngineSettings | None = None,
    on_arrival: Callable[[int], None] | None = None,
    algorithm: Algorithm | None = None,
) -> SimulationResult:
    """Run ``policy`` (with OCL ``algorithm``, default ``vanilla``) on ``items`` on the virtual clock with
    stage times from ``profile``."""
    setup = policy.setup(model, len(units), arrival_interval)
    engine = StreamEngine(units, setup, settings, algorithm=algorithm)
    times = StageTimes.from_profile(profile, setup.plan.partition)
    return engine.run_virtual(items, times, arrival_interval, test=test, on_arrival=on_arrival)


def _grid(rows: list[list[int]]) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(r) for r in rows)
