"""The trainer's learner: ferret_core's engine on the wall clock, executing the planner's plan.

Arrivals go through :meth:`WallClock.submit` (its prediction executor predicts with the master and
dispatches item i to worker i mod N); the trainer waits only for that (milliseconds), never for training.
An item's ``done`` fires once it is predicted and dispatched (or skipped): group offsets therefore track
predictions, while snapshots drain the pipeline first, so a snapshot's offsets exactly cover the work its
weights reflect (DESIGN §4). A re-plan drains, copies the master weights into the model's units and
rebuilds the pipeline for the new plan: weights carry over; compensator state (λ, moments, delta rings,
whose sizes depend on the plan) starts afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from ferret_core.engine import EngineSettings, StreamEngine
from ferret_core.engine.policies import FerretPolicy
from ferret_core.engine.wall_clock import WallClock
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.profiler import resolve_device
from ferret_core.zoo import ZooModel
from services.config import Settings
from services.trainer.learner import LearnerPrediction, Verdict

PREDICTION_TIMEOUT_S = 60.0


class EngineLearner:
    """Implements :class:`services.trainer.learner.Learner` over a :class:`StreamEngine`."""

    def __init__(self, model: ZooModel, plan: Plan, settings: Settings) -> None:
        self.model = model
        self.engine_settings = EngineSettings(
            lr=settings.trainer.lr,
            compensator=settings.trainer.compensator,
            measure_memory=True,
            keep_trace=False,
            validate=False,
        )
        self.device = resolve_device(settings.trainer.device)
        self._peak_before = 0
        self._updates_before = 0
        self._backprops_before = 0
        self._start(plan)

    def _start(self, plan: Plan) -> None:
        setup = FerretPolicy(plan).setup(self.model.name, self.model.num_units, plan.arrival_interval)
        self.engine = StreamEngine(self.model.units, setup, self.engine_settings, devices=self._stage_devices(plan))
        self.clock: WallClock = self.engine.wall_clock().start()

    def _stage_devices(self, plan: Plan) -> list[torch.device] | None:
        """CPU: None (where the units are). CUDA: ``cuda:N`` for every stage, or, for plain ``cuda`` with
        several GPUs visible, stage j on GPU j mod count (a device per stage where several exist)."""
        if self.device.type != "cuda":
            return None
        if self.device.index is not None:
            return [self.device] * plan.num_stages
        count = torch.cuda.device_count()
        return [torch.device("cuda", j % count) for j in range(plan.num_stages)]

    # -- the loop's calls ----------------------------------------------------------------------------
    def arrive(
        self, item: int, x: torch.Tensor, y: int | None, done: Callable[[], None]
    ) -> tuple[LearnerPrediction, Verdict]:
        arrival = self.clock.submit(x, y, index=item).result(PREDICTION_TIMEOUT_S)
        done()
        prediction = LearnerPrediction(arrival.prediction, arrival.confidence, self._model_version())
        if arrival.skipped is None:
            return prediction, Verdict(True, worker=item % self.engine.setup.plan.num_workers)
        return prediction, Verdict(False, reason=arrival.skipped.value)

    def drain(self) -> None:
        self.clock.drain()

    def apply_plan(self, plan: Plan) -> None:
        if plan.partition.num_units != self.model.num_units:
            raise ConfigError(
                f"plan for {plan.partition.num_units} units cannot drive {self.model.name!r} "
                f"({self.model.num_units} units)"
            )
        self.clock.drain()
        self._copy_master_into_units()
        stats = self.stats()
        self._peak_before = int(stats["peak_bytes"])
        self._updates_before = int(stats["updates"])
        self._backprops_before = int(stats["backward_passes"])
        self.clock.close()
        self._start(plan)

    # -- state -----------------------------------------------------------------------------------
    def _copy_master_into_units(self) -> None:
        for tensors in self._unit_tensors().values():
            for (unit, name), value in tensors.items():
                target = (
                    self.model.units[unit].get_parameter(name)
                    if _is_param(self.model, unit, name)
                    else (self.model.units[unit].get_buffer(name))
                )
                with torch.no_grad():
                    target.copy_(value)

    def _unit_tensors(self) -> dict[int, dict[tuple[int, str], torch.Tensor]]:
        """Master tensors by stage, keyed by (unit index, name inside the unit)."""
        out: dict[int, dict[tuple[int, str], torch.Tensor]] = {}
        stages = self.engine.setup.plan.partition.stages
        for j, tensors in enumerate(self.engine.pipeline.master_state()):
            out[j] = {}
            for key, value in tensors.items():
                local, _, name = key.partition(".")
                out[j][(stages[j][int(local)], name)] = value
        return out

    def state_tensors(self) -> dict[str, torch.Tensor]:
        out = {
            f"model.{unit}.{name}": value
            for tensors in self._unit_tensors().values()
            for (unit, name), value in tensors.items()
        }
        out["engine.updates"] = torch.tensor(self._model_version())
        return out

    def load_state_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.clock.drain()
        for key, value in tensors.items():
            if not key.startswith("model."):
                continue
            _, unit, name = key.split(".", 2)
            module = self.model.units[int(unit)]
            target = module.get_parameter(name) if _is_param(self.model, int(unit), name) else module.get_buffer(name)
            with torch.no_grad():
                target.copy_(value)
        self._updates_before = int(tensors.get("engine.updates", torch.tensor(0)))
        plan = self.engine.setup.plan
        self.clock.close()
        self._start(plan)

    def stats(self) -> dict[str, float]:
        pipeline = self.engine.pipeline
        counters = pipeline.counters
        meter = pipeline.meter
        staleness = pipeline.mean_staleness()
        return {
            "backward_passes": float(self._backprops_before + counters.trained_any_stage),
            "updates": float(self._updates_before + sum(counters.updates_per_stage())),
            "peak_bytes": float(max(self._peak_before, meter.peak_bytes if meter is not None else 0)),
            "measured_bytes": float(meter.peak_bytes if meter is not None else 0),
            "mean_staleness": float(sum(staleness) / len(staleness)) if staleness else 0.0,
        }

    def _model_version(self) -> int:
        return self._updates_before + sum(self.engine.pipeline.counters.updates_per_stage())

    def close(self) -> None:
        self.clock.drain()
        self.clock.close()


def _is_param(model: ZooModel, unit: int, name: str) -> bool:
    return name in dict(model.units[unit].named_parameters())
