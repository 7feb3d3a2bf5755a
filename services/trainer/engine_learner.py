"""The trainer's learner: ferret_core's engine on the wall clock, running ``trainer.method`` (any method
of the core's registry, read live as :mod:`services.trainer.live_methods` says) over the planner's plan.

Arrivals go through :meth:`WallClock.submit`; the record path's wait for the outcome predicts them with
the master, inline on its thread, and dispatches each, admitting it by its event time
(:func:`services.trainer.live_methods.live_admission`);
the record path waits only for that (milliseconds), never for training, and gets the engine's own answer
back: the skip reason or the worker it dispatched to. Training runs on the executors' threads, or, for a
one-executor CPU plan (``trainer.training_thread``), on the record path's thread between batches
(:meth:`EngineLearner.train_step`), so the two do not hand the GIL back and forth (docs/service.md "Which
thread trains"). Online accuracy is scored
by the trainer's counters, once (the engine runs with ``score_online`` off). A re-plan drains, copies the
master weights into the model's units and rebuilds the pipeline for the new plan: weights carry over,
and the compensators keep what the new plan can use (:mod:`ferret_core.engine.carry`: λ per stage when the
partition is unchanged, per-parameter moments re-split at the new stage boundaries; the delta ring
restarts empty).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ferret_core.engine import EngineSettings, SkipReason, StreamEngine
from ferret_core.engine.admission import AdmissionSettings
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.wall_clock import WallClock
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.profiler import resolve_device
from ferret_core.profile import ModelProfile
from ferret_core.zoo import ZooModel
from services.config import Settings
from services.failpoints import failpoint, is_enabled
from services.trainer.learner import ArrivalOutcome, LearnerFailed, LearnerStats
from services.trainer.lineage import Lineage
from services.trainer.live_methods import live_setup, not_planned, plans_for_budget
from services.trainer.unit_weights import (
    arrival_outcome,
    copy_into_units,
    largest_weight,
    load_snapshot_tensors,
    snapshot_tensors,
)

PREDICTION_TIMEOUT_S = 60.0


class EngineLearner:
    """Implements :class:`services.trainer.learner.Learner` over a :class:`StreamEngine`."""

    def __init__(self, model: ZooModel, plan: Plan, settings: Settings, profile: ModelProfile | None = None) -> None:
        self.model = model
        self.profile = profile  # lets the pipeline schedules and sequential methods report planned bytes
        self.method = settings.trainer.method
        self.plans_for_budget = plans_for_budget(self.method)
        self.engine_settings = EngineSettings(
            lr=settings.trainer.lr,
            compensator=settings.trainer.compensator,
            compensator_settings=settings.trainer.compensator_config(),
            measure_memory=True,
            keep_trace=False,
            validate=False,
            score_online=False,  # the trainer's counters score every prediction (with late labels)
            top_k=max(1, settings.trainer.prediction_top_k),
            max_step_ratio=settings.guard.max_step_ratio,  # the norm guard (ferret_core.engine.step_guard)
        )
        self.top_k = settings.trainer.prediction_top_k  # published per Prediction (0: none)
        self.device = resolve_device(settings.trainer.device)
        self.training_thread = settings.trainer.training_thread
        self._peak_before = 0
        self._updates_before = 0
        self.lineage = Lineage()  # what model versions count along (a restore begins a new one)
        self._backprops_before = 0
        self._truncated_before = 0  # compensations cut short under earlier plans, not carried over
        self._non_finite_before = 0
        self._start(plan)

    def _start(self, plan: Plan) -> None:
        setup, admission = self._live_setup(plan)
        self.admission = admission
        mid_step = (lambda: failpoint("trainer.mid-step")) if is_enabled("trainer.mid-step") else None
        self.engine = StreamEngine(
            self.model.units,
            setup,
            self.engine_settings,
            devices=self._stage_devices(plan),
            end_of_action=mid_step,  # test-only: fail inside a training step (CPU stages)
        )
        # predictions inline on the record path's thread: no hand-over to a prediction thread and back;
        # training too where this plan trains on the loop (``trains_on_loop``)
        self.clock: WallClock = self.engine.wall_clock(
            admission=admission, inline_predictions=True, inline_training=self.trains_on_loop(self.engine.plan)
        ).start()

    def trains_on_loop(self, plan: Plan) -> bool:
        """Whether ``plan`` trains on the record path's thread (``trainer.training_thread``): ``loop``
        always, ``executors`` never, ``auto`` when the plan has one live executor (one worker × one stage)
        on the CPU: with a record-path thread beside one executor thread the GIL changes hands several
        times per item, and the executor trained fewer items (docs/service.md "Which thread trains")."""
        if self.training_thread != "auto":
            return self.training_thread == "loop"
        executors = sum(1 for w in plan.workers if w.live) * plan.num_stages
        return executors == 1 and self.device.type == "cpu"

    def _live_setup(self, plan: Plan) -> tuple[PolicySetup, AdmissionSettings | None]:
        """The engine setup and the wall clock's admission rule this learner's method runs ``plan`` with."""
        return live_setup(
            self.method,
            plan,
            self.model.name,
            self.model.num_units,
            profile=self.profile,
            compensator=self.engine_settings.compensator,
        )

    def _stage_devices(self, plan: Plan) -> list[torch.device] | None:
        """CPU: None (where the units are). CUDA: ``cuda:N`` for every stage, or, for plain ``cuda`` with
        several GPUs visible, stage j on GPU j mod count (a device per stage where several exist)."""
        if self.device.type != "cuda":
            return None
        if self.device.index is not None:
            return [self.device] * plan.num_stages
        count = torch.cuda.device_count()
        return [torch.device("cuda", j % count) for j in range(plan.num_stages)]

    @property
    def plan(self) -> Plan:
        return self.engine.plan

    # -- the record path's call ------------------------------------------------------------------------
    def arrive(self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None) -> ArrivalOutcome:
        return self.submit(item, x, y, event_time_ms)()

    def submit(
        self, item: int, x: torch.Tensor, y: int | None, event_time_ms: int | None = None
    ) -> Callable[[], ArrivalOutcome]:
        """Queue the item on the wall clock (arrivals queued together are predicted in one forward pass);
        the returned call predicts what is queued, on the caller's thread (inline predictions), and
        returns the item's prediction and dispatch."""
        event_time = None if event_time_ms is None else event_time_ms / 1000.0
        try:
            future = self.clock.submit(x, y, index=item, event_time=event_time)
        except Exception as exc:
            raise self._failed(item, exc) from exc

        def outcome() -> ArrivalOutcome:
            try:
                arrival = self.clock.outcome(future, PREDICTION_TIMEOUT_S)
            except Exception as exc:
                raise self._failed(item, exc) from exc
            return arrival_outcome(
                arrival, self._updates_before, self.top_k, self._largest_weight, self.engine_settings.lr,
                self.lineage.value,
            )

        return outcome

    def pending_training(self) -> bool:
        return self.clock.pending_training()

    def train_step(self) -> bool:
        """One training action on the loop's thread. A failure is not raised here, where no record is at
        hand: the clock keeps it and the next ``submit``, outcome or drain raises it, blamed on the item
        whose action failed, as an executor thread's failure is."""
        try:
            return self.clock.train_step()
        except Exception:  # kept by the clock (the clock is stopped); reported with the next record
            return False

    def measured_service_times(self) -> list[float | None]:
        """Per worker, the measured service time (s per item) of the wall clock, None until measured."""
        return list(self.clock.measured_service_times())

    def trace_view(self) -> dict[str, float | int | None]:
        """Worker 0's admission view for the record path's trace (``path_trace.py``; a diagnosis aid)."""
        return self.clock.admission_view(0)

    def _failed(self, item: int, exc: Exception) -> LearnerFailed:
        """Name the item whose action failed (it may have arrived earlier)."""
        failed = self.engine.failed_item
        return LearnerFailed(item if failed is None else failed, exc)

    def _largest_weight(self) -> float:
        """The largest |value| of the master's tensors (held versions are not written: safe while training)."""
        return largest_weight(self.engine.unit_state())

    def drain(self, timeout: float | None = None) -> None:
        self.clock.drain(timeout)

    def apply_plan(self, plan: Plan) -> None:
        if not self.plans_for_budget:
            raise not_planned(self.method)
        if plan.partition.num_units != self.model.num_units:
            raise ConfigError(
                f"plan for {plan.partition.num_units} units cannot drive {self.model.name!r} "
                f"({self.model.num_units} units)"
            )
        if self._runs_unchanged(plan):  # only the stream's rate moved: no drain, no rebuild (no pause)
            self.engine.retarget(plan)
            return
        self.clock.drain()
        copy_into_units(self.model, self.engine.unit_state())
        compensators = self.engine.compensator_state()
        same_partition = plan.partition == self.plan.partition
        stats = self.engine.stats()
        old_plan = self.plan
        self._peak_before = max(self._peak_before, stats.peak_bytes or 0)
        self._updates_before += stats.updates
        self._backprops_before += stats.trained_any_stage
        truncated = sum(stats.compensations_truncated)
        self._non_finite_before += stats.skipped.get(SkipReason.NON_FINITE.value, 0)
        self.clock.close()
        try:
            failpoint("trainer.mid-replan")
            self._start(plan)
        except BaseException:  # the plan in force runs on (its weights are in the units)
            self._start(old_plan)
            self.engine.load_compensator_state(compensators)
            raise
        self.engine.carry_compensator_state(compensators, same_partition=same_partition)
        self._truncated_before += truncated - self._truncated_now()  # what the carry did not keep

    def _runs_unchanged(self, plan: Plan) -> bool:
        """Whether the pipeline in force already runs ``plan`` (:meth:`StreamEngine.can_retarget`: the same
        partition, workers, decay and profile times, so the same scheduler rules, staleness bounds and
        compensators) with the same admission W and K. Such a plan differs only in the arrival interval
        and what the planner derives from it (R_F, predicted bytes), which the running engine does not
        read; a re-plan to it would drain the pipeline (448–599 ms without predictions,
        ``docs/service.md`` "Latency") to rebuild the same pipeline."""
        if not self.engine.can_retarget(plan):
            return False
        _, admission = self._live_setup(plan)
        return admission == self.admission

    # -- state -----------------------------------------------------------------------------------------
    def state_tensors(self) -> dict[str, torch.Tensor]:
        return snapshot_tensors(self.engine.unit_state(), self._model_version(), self.lineage.value)

    def master_tensors(self) -> dict[str, torch.Tensor]:
        return snapshot_tensors(self.engine.unit_state(), self._model_version(), self.lineage.value)

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.clock.drain()
        self._updates_before = load_snapshot_tensors(self.model, tensors)
        self.lineage.branch()  # the version went back (or elsewhere): a new line of updates
        self._backprops_before += self.engine.stats().trained_any_stage
        self._non_finite_before += self.engine.stats().skipped.get(SkipReason.NON_FINITE.value, 0)
        plan = self.engine.plan
        self.clock.close()
        self._start(plan)

    def compensator_state(self) -> list[dict[str, Any]]:
        self.clock.drain()
        return self.engine.compensator_state()

    def load_compensator_state(self, states: Sequence[Mapping[str, Any]]) -> None:
        self.clock.drain()
        self.engine.load_compensator_state(states)
        self._truncated_before = 0  # the restored compensators carry their own count

    def stats(self) -> LearnerStats:
        stats = self.engine.stats()
        measured = stats.peak_bytes or 0
        staleness = stats.mean_staleness
        planned = self.engine.planned  # the method's own plan of bytes (None: not planned)
        return LearnerStats(
            backward_passes=self._backprops_before + stats.trained_any_stage,
            model_version=self._updates_before + stats.updates,
            measured_bytes=measured,
            peak_bytes=max(self._peak_before, measured),
            mean_staleness=sum(staleness) / len(staleness) if staleness else None,
            planned_bytes=None if planned is None else planned.planned_bytes,
            max_staleness=stats.max_staleness,
            staleness_bound=stats.staleness_bound,
            compensations_truncated=self._truncated_before + sum(stats.compensations_truncated),
            non_finite=self._non_finite_before + stats.skipped.get(SkipReason.NON_FINITE.value, 0),
            model_lineage=self.lineage.value,
        )

    def _truncated_now(self) -> int:
        return sum(self.engine.stats().compensations_truncated)

    def _model_version(self) -> int:
        return self._updates_before + self.engine.updates()

    def close(self) -> None:
        self.clock.drain()
        self.clock.close()
