"""The frozen outcome of one engine run, and its JSON form (``ferret simulate --json``)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ferret_core.schedule.actions import TraceEvent

Grid = tuple[tuple[int, ...], ...]  # [worker][stage]


@dataclass(frozen=True)
class EngineStats:
    """A running engine's counters (:meth:`StreamEngine.stats`), named as in :class:`SimulationResult`:
    ``items`` dispatched so far (each predicted), ``trained`` / ``trained_any_stage`` back-propagated through
    every / at least one stage, ``skipped`` by reason, master ``updates`` summed over stages (the model
    version) and per stage, items ``in_flight``, the measured ``peak_bytes`` (``None`` when memory is not
    measured), and per stage the mean and max staleness of applied gradients, the schedule's staleness
    bound and the compensations cut short (the gradient was staler than the deltas the compensator kept)."""

    items: int
    trained: int
    trained_any_stage: int
    skipped: Mapping[str, int]
    updates: int
    updates_per_stage: tuple[int, ...]
    in_flight: int
    peak_bytes: int | None
    mean_staleness: tuple[float, ...]
    max_staleness: tuple[int, ...]
    staleness_bound: tuple[int, ...] = ()
    compensations_truncated: tuple[int, ...] = ()


@dataclass(frozen=True)
class SimulationResult:
    """Accuracies in percent; bytes measured (``peak_bytes``) or predicted (``planned_bytes``).

    ``trained``: items back-propagated through every stage; ``trained_any_stage``: through at least one
    (T3 back-propagates some items through the last stages only). ``skipped`` counts items by reason;
    every item is predicted whether skipped or not, so ``items = trained_any_stage + Σ skipped`` once the
    run has drained. Per-stage tuples are indexed by stage; grids by [worker][stage].
    ``lambdas``/``relative_correction``: the compensator's final λ (``None`` where it has none) and mean
    relative correction ‖g_τ − g‖/‖g‖ over its calls with τ > 0, per stage. ``staleness_histogram``: per
    stage, how many applied gradients had each staleness τ. ``lambda_trace``: (items arrived, λ per stage)
    sampled along the run by a caller that asks for it (``ferret simulate``: every tenth of the stream).
    """

    method: str
    compensator: str
    oacc: float
    tacc: float | None
    items: int
    trained: int
    trained_any_stage: int
    skipped: Mapping[str, int]
    updates_per_stage: tuple[int, ...]
    peak_bytes: int | None
    cuda_peak_bytes: int | None
    planned_bytes: int | None
    memory_breakdown: Mapping[str, int]
    mean_staleness: tuple[float, ...]
    max_staleness: tuple[int, ...]
    staleness_bound: tuple[int, ...]
    lambdas: tuple[float | None, ...]
    relative_correction: tuple[float, ...]
    num_stages: int
    num_workers: int
    admitted: tuple[int, ...]
    forwards: Grid
    backwards: Grid
    recomputes: Grid
    updates: Grid
    wall_seconds: float
    trace: tuple[TraceEvent, ...] | None = None
    algorithm: str = "vanilla"
    staleness_histogram: tuple[Mapping[int, int], ...] = ()
    lambda_trace: tuple[tuple[int, tuple[float | None, ...]], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values; the trace is left out (``ferret simulate --trace FILE`` writes it as CSV)."""
        return {
            "method": self.method,
            "algorithm": self.algorithm,
            "compensator": self.compensator,
            "oacc": self.oacc,
            "tacc": self.tacc,
            "items": self.items,
            "trained": self.trained,
            "trained_any_stage": self.trained_any_stage,
            "skipped": dict(self.skipped),
            "updates_per_stage": list(self.updates_per_stage),
            "peak_bytes": self.peak_bytes,
            "cuda_peak_bytes": self.cuda_peak_bytes,
            "planned_bytes": self.planned_bytes,
            "memory_breakdown": dict(self.memory_breakdown),
            "mean_staleness": list(self.mean_staleness),
            "max_staleness": list(self.max_staleness),
            "staleness_bound": list(self.staleness_bound),
            "lambda": [None if v is None or not math.isfinite(v) else v for v in self.lambdas],
            "relative_correction": list(self.relative_correction),
            "staleness_histogram": [{str(k): h[k] for k in sorted(h)} for h in self.staleness_histogram],
            "lambda_trace": [
                {"items": n, "lambda": [None if v is None or not math.isfinite(v) else v for v in lams]}
                for n, lams in self.lambda_trace
            ],
            "num_stages": self.num_stages,
            "num_workers": self.num_workers,
            "admitted": list(self.admitted),
            "forwards": [list(r) for r in self.forwards],
            "backwards": [list(r) for r in self.backwards],
            "recomputes": [list(r) for r in self.recomputes],
            "updates": [list(r) for r in self.updates],
            "wall_seconds": self.wall_seconds,
        }
