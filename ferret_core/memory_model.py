"""Bytes a configuration needs: eq. ferret-svre's M_F plus what exists at run time (DESIGN §3.8, §3.10).

Two variants (``MemorySettings.variant``):

* ``paper``: eq. ferret-svre exactly, per worker Σ_i (1 + ⌈(P−i−1)/c^a⌉ − c^o)(|w_i| + |a_i| − c^r·Σ|â_l|);
* ``engine``: what the engine of DESIGN §3.13 holds per worker and stage: its replica plus the stashes
  made while back-propagated items are in flight (1 + own updates in flight, see
  :mod:`ferret_core.staleness`) times |w_i|, plus, for each in-flight item that will be back-propagated
  at stage i (⌈(P−i)/period⌉ of the P−i in flight), autograd's saved tensors (or only the stage input
  under T1). Unlike the paper, T2 does not free activations: in-flight items still hold them.

Both add the extras the paper leaves out, each counted once (not per worker) unless said: the master copy
(ΣW), one transient gradient (max_i |w_i|), accumulation buffers (|w_i| per worker and stage with
c^a > 1), optimizer state (slots × ΣW), compensator state (Iter-Fisher: v_r, v_a = 2ΣW when λ is tuned,
plus the delta ring Σ_i capacity_i·|w_i| sized by the staleness bound; Gap-Aware: ΣW), the prediction
path's activations (max_l input_l + output_l), and the OCL algorithm's state (replay buffer items, LwF's
teacher ΣW, MAS importances and anchor 2ΣW). ``extras=False`` leaves eq. ferret-svre alone;
``count_elements=True`` reports elements instead of bytes (the paper's unit, used by golden tests).

The planner's search condition, ``predicted_bytes`` and ``min_feasible_bytes`` all use
:meth:`MemoryModel.total`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ferret_core.cost_model import StageGeometry, backprop_period, paper_worker_elements
from ferret_core.errors import ConfigError
from ferret_core.plan import WorkerConfig
from ferret_core.profile import ModelProfile, dtype_bytes
from ferret_core.staleness import bound_for_workers, own_updates_in_flight

MEMORY_VARIANTS = ("paper", "engine")
COMPENSATORS_WITH_RING = ("iter-fisher", "iter-fisher-cf")
OPTIMIZER_SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}


@dataclass(frozen=True)
class MemorySettings:
    """How predicted memory is counted."""

    variant: str = "paper"
    dtype: str = "float32"
    extras: bool = True
    count_elements: bool = False
    optimizer: str = "sgd"
    compensator: str = "iter-fisher"
    lambda_tuning: bool = True  # η_λ > 0: Iter-Fisher keeps v_r and v_a (Alg. 1)
    replay_items: int = 0  # ER / MIR buffer size (the paper uses 5000)
    teacher_copy: bool = False  # LwF
    importances: bool = False  # MAS
    micro_batch: int = 1  # items per pipeline step (ER/MIR: the item plus its replayed items)

    def __post_init__(self) -> None:
        if self.variant not in MEMORY_VARIANTS:
            raise ConfigError(f"memory model must be one of {MEMORY_VARIANTS}, got {self.variant!r}")
        if self.optimizer not in OPTIMIZER_SLOTS:
            raise ConfigError(f"optimizer must be one of {sorted(OPTIMIZER_SLOTS)}, got {self.optimizer!r}")
        if self.micro_batch < 1:
            raise ConfigError(f"micro_batch must be >= 1, got {self.micro_batch}")
        if self.replay_items < 0:
            raise ConfigError(f"replay_items must be >= 0, got {self.replay_items}")
        dtype_bytes(self.dtype)

    @classmethod
    def paper_elements(cls) -> MemorySettings:
        """Eq. ferret-svre alone, in elements (the paper's unit)."""
        return cls(variant="paper", extras=False, count_elements=True)

    @property
    def unit_bytes(self) -> int:
        return 1 if self.count_elements else dtype_bytes(self.dtype)


class MemoryModel:
    """Bytes of a whole configuration: Σ_n worker term + shared term."""

    def __init__(self, geometry: StageGeometry, profile: ModelProfile, settings: MemorySettings) -> None:
        geometry = geometry.per_step(settings.micro_batch)  # activations of a step of micro_batch items
        self.geometry = geometry
        self.settings = settings
        self._fixed = self._fixed_extras(profile) if settings.extras else {}
        self._ring = settings.extras and settings.compensator in COMPENSATORS_WITH_RING

    # -- per worker -------------------------------------------------------------------------------
    def worker_elements(self, worker: WorkerConfig) -> int:
        """Worker n's term, in elements (0 when removed)."""
        if not worker.live:
            return 0
        if self.settings.variant == "paper":
            held = paper_worker_elements(self.geometry, worker.recompute, worker.accumulation, worker.omission)
        else:
            held = self._engine_worker_elements(worker)
        if self.settings.extras:
            held += sum(w for w, a in zip(self.geometry.weights, worker.accumulation, strict=True) if a > 1)
        return held

    def _engine_worker_elements(self, worker: WorkerConfig) -> int:
        g = self.geometry
        p = g.num_stages
        total = 0
        for i in range(p):
            versions = 1 + own_updates_in_flight(worker, i, p)
            inflight_backprop = math.ceil((p - i) / backprop_period(worker.omission, i))
            per_item = g.stage_inputs[i] if worker.recompute else g.saved[i]
            total += versions * g.weights[i] + inflight_backprop * per_item
        return total

    # -- shared -----------------------------------------------------------------------------------
    def _fixed_extras(self, profile: ModelProfile) -> dict[str, int]:
        s = self.settings
        g = self.geometry
        total_w = g.total_weights
        outputs = [layer.activations for layer in profile.layers]
        inputs = [profile.input_elements, *outputs[:-1]]
        extras = {
            "master_copy": total_w,
            "transient_gradient": max(g.weights),
            "optimizer_state": OPTIMIZER_SLOTS[s.optimizer] * total_w,
            "prediction_path": max(i + o for i, o in zip(inputs, outputs, strict=True)),
        }
        if s.compensator in COMPENSATORS_WITH_RING and (s.lambda_tuning or s.compensator == "iter-fisher-cf"):
            extras["compensator_moments"] = 2 * total_w
        if s.compensator == "gap-aware":
            extras["compensator_moments"] = total_w
        if s.replay_items:
            extras["replay_buffer"] = s.replay_items * profile.input_elements
        if s.teacher_copy:
            extras["lwf_teacher"] = total_w
        if s.importances:
            extras["mas_importances"] = 2 * total_w
        return extras

    @property
    def has_ring(self) -> bool:
        return self._ring

    @property
    def fixed_elements(self) -> int:
        """Extras that do not depend on the configuration."""
        return sum(self._fixed.values())

    def ring_elements(self, workers: Sequence[WorkerConfig]) -> int:
        """Iter-Fisher delta ring: Σ_i bound_i·|w_i| (DESIGN §3.4, sized by the staleness bound)."""
        if not self._ring:
            return 0
        p = self.geometry.num_stages
        return sum(bound_for_workers(workers, i, p) * self.geometry.weights[i] for i in range(p))

    def shared_elements(self, workers: Sequence[WorkerConfig]) -> int:
        return self.fixed_elements + self.ring_elements(workers)

    # -- totals -----------------------------------------------------------------------------------
    def total(self, workers: Sequence[WorkerConfig]) -> int:
        """Predicted memory of the configuration in bytes (elements with ``count_elements``)."""
        elements = sum(self.worker_elements(w) for w in workers) + self.shared_elements(workers)
        return elements * self.settings.unit_bytes

    def breakdown(self, workers: Sequence[WorkerConfig]) -> dict[str, int]:
        """Bytes by component; the values sum to :meth:`total`."""
        unit = self.settings.unit_bytes
        parts = {"workers": sum(self.worker_elements(w) for w in workers) * unit}
        parts.update({name: value * unit for name, value in self._fixed.items()})
        if self._ring:
            parts["compensator_ring"] = self.ring_elements(workers) * unit
        return parts
