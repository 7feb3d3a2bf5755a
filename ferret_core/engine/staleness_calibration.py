"""Calibrate the cost of staleness on a stream's head (the planner's accuracy objective; ours).

:class:`~ferret_core.planning.staleness_cost.StalenessCost` is an exchange rate between items and
staleness. This module measures it with the engine itself, on the virtual clock, on the first items of
the stream a plan will run on (the caller hands them in; the services choose, load and cache):

* **fresh, one item in k** (k ∈ ``every``, and k = 1): one stage, one worker whose item takes exactly k
  arrival intervals, no waiting slot — it trains items 0, k, 2k, … at staleness 0, and predicts all;
* **stale by τ** (τ ∈ ``staleness``): one stage, τ + 1 workers whose item takes exactly τ + 1 intervals —
  every item is trained, and each gradient is applied after exactly the τ updates of the other workers
  (the engine reports the staleness it counted; the run is refused if it is not τ).

Each is run for every seed of ``seeds`` (the model's initialisation; the stream is the same), with the
SGD learning rate and the compensator the calibrated runs will use (``none`` by default: the cost
of uncompensated staleness), and the mean online accuracies become d(τ) by
:meth:`StalenessCost.from_accuracies`. Times are integers (F = m, B = 2m, arrivals every 3), so "exactly
k intervals" holds without float noise. The whole model is one stage: d is a per-gradient worth, which
the planner applies per stage (docs/planner.md reading 13).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from torch import nn

from ferret_core.engine.engine import EngineSettings, StreamEngine
from ferret_core.engine.policies import FerretPolicy, sequential_plan
from ferret_core.engine.result import SimulationResult
from ferret_core.engine.virtual_clock import Sample
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan, WorkerConfig
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.schedule.stage_times import StageTimes

ARRIVAL = 3.0  # the calibration clock's arrival interval; a run of m intervals has F = m, B = 2m

CalibrationRun = tuple[Sequence[nn.Module], Sequence[Sample]]  # a seed's fresh units and the stream's head


@dataclass(frozen=True)
class CalibrationSettings:
    """What the calibration runs: ``staleness`` (τ > 0) and ``every`` (k > 1: fresh, one item in k)
    points, the model initialisations ``seeds``, the master's SGD ``lr`` and ``compensator``."""

    staleness: tuple[int, ...] = (1, 2, 3, 4, 6, 8)
    every: tuple[int, ...] = (2, 3, 4, 6, 8, 16)
    seeds: tuple[int, ...] = (1000, 1001, 1002)
    lr: float = 1e-3
    compensator: str = "none"

    def __post_init__(self) -> None:
        if not self.staleness or any(t < 1 for t in self.staleness) or len(set(self.staleness)) != len(self.staleness):
            raise ConfigError(f"staleness points must be distinct integers >= 1, got {self.staleness}")
        if not self.every or any(k < 2 for k in self.every) or len(set(self.every)) != len(self.every):
            raise ConfigError(f"'every' must be distinct integers >= 2 (train one item in k), got {self.every}")
        if not self.seeds:
            raise ConfigError("the calibration needs at least one seed")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")

    def to_dict(self) -> dict[str, object]:
        return {
            "staleness": list(self.staleness),
            "every": list(self.every),
            "seeds": list(self.seeds),
            "lr": self.lr,
            "compensator": self.compensator,
        }


def calibration_plan(model: str, num_units: int, workers: int) -> Plan:
    """One stage, ``workers`` live workers without T1–T3: the calibration's pipeline (the sequential plan
    with more workers, unit stage times and the engine's byte model)."""
    return replace(
        sequential_plan(model, num_units, ARRIVAL),
        workers=tuple(WorkerConfig(n, True, False, (1,), (0,)) for n in range(workers)),
        stage_forward_time=1.0,
        stage_backward_time=2.0,
        memory_model="engine",
    )


def run_point(
    model: str, run: CalibrationRun, *, workers: int, intervals: int, settings: CalibrationSettings
) -> SimulationResult:
    """One calibration run: ``workers`` workers whose item takes ``intervals`` arrival intervals (no
    waiting slot); its result (online accuracy, items trained, staleness)."""
    units, items = run
    plan = calibration_plan(model, len(units), workers)
    setup = FerretPolicy(plan, wait_slots=0).setup(model, len(units), ARRIVAL)
    engine = StreamEngine(
        units,
        setup,
        EngineSettings(
            lr=settings.lr, compensator=settings.compensator, measure_memory=False, keep_trace=False, validate=False
        ),
    )
    times = StageTimes((float(intervals),), (2.0 * intervals,))
    return engine.run_virtual(items, times, ARRIVAL)


def calibrate_staleness(
    model: str,
    make_run: Callable[[int], CalibrationRun],
    settings: CalibrationSettings,
    *,
    source: str = "",
    on_run: Callable[[str], None] | None = None,
) -> StalenessCost:
    """Measure d(τ) (see the module docstring); ``make_run(seed)`` gives fresh units initialised with
    ``seed`` and the stream's head; ``on_run`` is told each finished run (progress)."""
    fresh: dict[float, list[float]] = {}
    stale: dict[float, list[float]] = {}
    for seed in settings.seeds:
        for k in (1, *settings.every):
            result = run_point(model, make_run(seed), workers=1, intervals=k, settings=settings)
            fresh.setdefault(1.0 / k, []).append(result.oacc)
            if on_run is not None:
                on_run(f"fresh 1/{k}, seed {seed}")
        for tau in settings.staleness:
            result = run_point(model, make_run(seed), workers=tau + 1, intervals=tau + 1, settings=settings)
            most = result.max_staleness
            if most != (tau,):
                raise ConfigError(
                    f"calibration run for staleness {tau} applied its gradients at staleness up to {list(most)}, "
                    f"expected {tau}; the stream's head is too short for {tau + 1} workers (give more items)"
                )
            stale.setdefault(float(tau), []).append(result.oacc)
            if on_run is not None:
                on_run(f"stale {tau}, seed {seed}")
    cost = StalenessCost.from_accuracies(
        {f: statistics.fmean(v) for f, v in fresh.items()},
        {t: statistics.fmean(v) for t, v in stale.items()},
        source=source,
    )
    measurements = {**cost.measurements, "settings": settings.to_dict()}
    return StalenessCost(cost.staleness, cost.worth, cost.source, measurements)
