"""The planner's output: a partition L and a pipeline configuration C (paper §"Model Partitioning").

Plans are frozen data. The engine executes them; the CLI and the gRPC control plane print them in the
schema of ``ferret plan --json`` (:meth:`Plan.to_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import reduce
from itertools import pairwise
from typing import Any

from ferret_core.errors import ConfigError


@dataclass(frozen=True)
class Partition:
    """Partition scheme L: stage j holds units [L_j, L_{j+1}) (notation table)."""

    boundaries: tuple[int, ...]

    def __post_init__(self) -> None:
        b = self.boundaries
        if len(b) < 2 or b[0] != 0 or any(x >= y for x, y in pairwise(b)):
            raise ConfigError(f"partition boundaries must start at 0 and strictly increase, e.g. (0, 2, 5); got {b}")

    @property
    def num_stages(self) -> int:
        """P = |L| − 1."""
        return len(self.boundaries) - 1

    @property
    def num_units(self) -> int:
        return self.boundaries[-1]

    @property
    def stages(self) -> tuple[tuple[int, ...], ...]:
        """Unit indices of every stage, in order."""
        b = self.boundaries
        return tuple(tuple(range(b[j], b[j + 1])) for j in range(self.num_stages))


def backprop_period(omission: tuple[int, ...], stage: int) -> int:
    """LCM({c^o_{n,k} + 1 | k ∈ [stage, P−1]}) (eq. ferret-svre's LCM factor; DESIGN §3.6): under T3 a
    worker with per-stage omissions ``omission`` back-propagates ``stage`` for one item in this many. The
    one home of the formula: :meth:`WorkerConfig.backprop_period`, the cost model and the residency
    replay all call it."""
    return reduce(math.lcm, (o + 1 for o in omission[stage:]), 1)


@dataclass(frozen=True)
class WorkerConfig:
    """Configuration of worker slot n: c_n^d, c_n^r, c_{n,j}^a, c_{n,j}^o."""

    index: int
    live: bool
    recompute: bool
    accumulation: tuple[int, ...]
    omission: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.accumulation) != len(self.omission):
            raise ConfigError(
                f"worker {self.index}: accumulation and omission need one entry per stage, got "
                f"{len(self.accumulation)} and {len(self.omission)}"
            )
        if any(a < 1 for a in self.accumulation) or any(o < 0 for o in self.omission):
            raise ConfigError(
                f"worker {self.index}: accumulation steps must be >= 1 and omission steps >= 0, got "
                f"{self.accumulation} and {self.omission}"
            )

    @property
    def delay(self) -> int:
        """c_n^d: the residue class the worker serves (i ≡ c_n^d mod N), or −1 once removed (T4)."""
        return self.index if self.live else -1

    def backprop_period(self, stage: int) -> int:
        """The worker back-propagates ``stage`` for one item in this many (:func:`backprop_period`)."""
        return backprop_period(self.omission, stage)

    def backpropagates(self, item_in_worker: int, stage: int) -> bool:
        """Whether the worker's m-th item (m counted within the worker from 0) is back-propagated at
        ``stage`` under T3 (DESIGN §3.6): m ≡ 0 mod (c^o_{n,k}+1) for every k ≥ stage."""
        return self.live and item_in_worker % self.backprop_period(stage) == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "delay": self.delay,
            "live": self.live,
            "recompute": self.recompute,
            "accumulation": list(self.accumulation),
            "omission": list(self.omission),
        }


@dataclass(frozen=True)
class PlanStep:
    """One step of Alg. 2's greedy search, kept so a plan can explain itself."""

    kind: str  # "S2" (T2), "S3" (T3) or "S4" (T4)
    worker: int
    stage: int | None
    detail: str
    delta_rate: float  # ΔR_F (≤ 0)
    delta_bytes: int  # ΔM (< 0)


@dataclass(frozen=True)
class PlanObjectives:
    """What the planner's two objectives say of a plan (docs/planner.md reading 13).

    ``objective``: the one the plan was chosen by (``rate``: eq. ferret-svre's R_F, the paper's; ``accuracy``:
    R_F discounted by the measured cost of staleness). ``rate``: R_F. ``expected_staleness``: per stage, the
    mean staleness of the plan's applied gradients on the virtual clock (a replay of its schedule);
    ``trained_fraction``: the arrivals it trains there. ``discount``: the R_F-weighted mean of d(τ̄_j) over
    the plan's stage terms, and ``accuracy``: R_F × discount — both ``None`` without a measured cost.
    ``cost_source``: what that cost was measured on."""

    objective: str
    rate: float
    expected_staleness: tuple[float, ...]
    trained_fraction: float
    discount: float | None = None
    accuracy: float | None = None
    cost_source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "objective": self.objective,
            "rate": self.rate,
            "expected_staleness": list(self.expected_staleness),
            "trained_fraction": self.trained_fraction,
            "discount": self.discount,
            "accuracy": self.accuracy,
            "cost_source": self.cost_source,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanObjectives:
        discount, accuracy = data.get("discount"), data.get("accuracy")
        return cls(
            objective=str(data["objective"]),
            rate=float(data["rate"]),
            expected_staleness=tuple(float(x) for x in data["expected_staleness"]),
            trained_fraction=float(data["trained_fraction"]),
            discount=None if discount is None else float(discount),
            accuracy=None if accuracy is None else float(accuracy),
            cost_source=str(data.get("cost_source", "")),
        )


@dataclass(frozen=True)
class Plan:
    """A partition and a pipeline configuration with the cost model's predictions. ``objectives``: both
    objectives' view of the plan where the planner evaluated them (``ferret plan``; an ``accuracy`` plan
    always), else ``None`` (then ``to_dict`` leaves the key out)."""

    model: str
    partition: Partition
    workers: tuple[WorkerConfig, ...]
    arrival_interval: float  # t^d
    decay: float  # c
    stage_forward_time: float  # t^f = max_j Σ t̂^f over stage j
    stage_backward_time: float  # t^b
    adaptation_rate: float  # R_F (eq. ferret-svre), V_D = 1
    planned_bytes: int
    paper_memory_elements: int  # M_F of eq. ferret-svre alone
    min_feasible_bytes: int
    budget_bytes: int | None
    memory_model: str
    dtype: str
    memory_breakdown: Mapping[str, int] = field(default_factory=dict)
    memory_note: str = ""  # what the byte model counts (``MemorySettings.describe``)
    steps: tuple[PlanStep, ...] = ()
    recompute_note: str = ""
    objectives: PlanObjectives | None = None
    # bytes per host, rank 0 first, where the plan was made for several hosts (ferret_core.planning.host_memory)
    host_bytes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.workers:
            raise ConfigError("a plan needs at least one worker slot")
        if not any(w.live for w in self.workers):
            raise ConfigError("a plan needs at least one live worker (S4 never removes the last)")
        for worker in self.workers:
            if len(worker.accumulation) != self.partition.num_stages:
                raise ConfigError(
                    f"worker {worker.index} has {len(worker.accumulation)} stage settings for a "
                    f"{self.partition.num_stages}-stage partition"
                )

    @property
    def num_stages(self) -> int:
        return self.partition.num_stages

    @property
    def num_workers(self) -> int:
        """N: worker slots, the dispatch modulus (DESIGN §3.6), removed workers included."""
        return len(self.workers)

    @property
    def live_workers(self) -> int:
        return sum(1 for w in self.workers if w.live)

    @property
    def stages(self) -> tuple[tuple[int, ...], ...]:
        return self.partition.stages

    def worker_for_item(self, item: int) -> WorkerConfig:
        """The worker slot that item i is dispatched to: i ≡ c_n^d (mod N)."""
        return self.workers[item % self.num_workers]

    def to_dict(self) -> dict[str, Any]:
        """The schema of ``ferret plan --json`` (``objectives`` only where evaluated: an addition)."""
        out: dict[str, Any] = {
            "model": self.model,
            "stages": [list(s) for s in self.stages],
            "partition": list(self.partition.boundaries),
            "num_stages": self.num_stages,
            "workers": [w.to_dict() for w in self.workers],
            "num_workers": self.num_workers,
            "live_workers": self.live_workers,
            "planned_bytes": self.planned_bytes,
            "paper_memory_elements": self.paper_memory_elements,
            "min_feasible_bytes": self.min_feasible_bytes,
            "budget_bytes": self.budget_bytes,
            "adaptation_rate": self.adaptation_rate,
            "arrival_interval": self.arrival_interval,
            "stage_forward_time": self.stage_forward_time,
            "stage_backward_time": self.stage_backward_time,
            "decay": self.decay,
            "memory_model": self.memory_model,
            "memory_note": self.memory_note,
            "dtype": self.dtype,
            "memory_breakdown": dict(self.memory_breakdown),
            "steps": [
                {
                    "kind": s.kind,
                    "worker": s.worker,
                    "stage": s.stage,
                    "detail": s.detail,
                    "delta_rate": s.delta_rate,
                    "delta_bytes": s.delta_bytes,
                }
                for s in self.steps
            ],
            "recompute_note": self.recompute_note,
        }
        if self.objectives is not None:
            out["objectives"] = self.objectives.to_dict()
        if self.host_bytes:
            out["host_bytes"] = list(self.host_bytes)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict` (used by snapshots and the control plane). A document written before
        the planned bytes had one name (a snapshot's manifest, a ``ferret plan --json`` file) carries them
        as ``predicted_bytes``; it still reads."""
        partition = Partition(tuple(int(x) for x in data["partition"]))
        workers = tuple(
            WorkerConfig(
                index=int(w["index"]),
                live=bool(w["live"]),
                recompute=bool(w["recompute"]),
                accumulation=tuple(int(a) for a in w["accumulation"]),
                omission=tuple(int(o) for o in w["omission"]),
            )
            for w in data["workers"]
        )
        steps = tuple(
            PlanStep(
                kind=str(s["kind"]),
                worker=int(s["worker"]),
                stage=None if s["stage"] is None else int(s["stage"]),
                detail=str(s["detail"]),
                delta_rate=float(s["delta_rate"]),
                delta_bytes=int(s["delta_bytes"]),
            )
            for s in data.get("steps", [])
        )
        budget = data.get("budget_bytes")
        objectives = data.get("objectives")
        return cls(
            model=str(data["model"]),
            partition=partition,
            workers=workers,
            arrival_interval=float(data["arrival_interval"]),
            decay=float(data["decay"]),
            stage_forward_time=float(data["stage_forward_time"]),
            stage_backward_time=float(data["stage_backward_time"]),
            adaptation_rate=float(data["adaptation_rate"]),
            planned_bytes=int(data["planned_bytes"] if "planned_bytes" in data else data["predicted_bytes"]),
            paper_memory_elements=int(data["paper_memory_elements"]),
            min_feasible_bytes=int(data["min_feasible_bytes"]),
            budget_bytes=None if budget is None else int(budget),
            memory_model=str(data["memory_model"]),
            memory_note=str(data.get("memory_note", "")),
            dtype=str(data["dtype"]),
            memory_breakdown={str(k): int(v) for k, v in data.get("memory_breakdown", {}).items()},
            steps=steps,
            recompute_note=str(data.get("recompute_note", "")),
            objectives=None if objectives is None else PlanObjectives.from_dict(objectives),
            host_bytes=tuple(int(b) for b in data.get("host_bytes", ())),
        )
