"""The cost model: adaptation rate R_F and memory M_F of a configuration (eq. ferret-svre).

Everything here is a pure function of a :class:`StageGeometry` (a profile cut by a partition L) and a
worker configuration. Readings of the paper (DESIGN §3):

* workers are indexed n = 0..N−1 (the sums' lower bound 1 is a typo, §3.6); removed workers (c^d = −1)
  contribute nothing;
* t^f, t^b are the maxima over stages of the stage sums (notation table, §3.5);
* V_D = 1 (it cancels, §3.9); the decay constant c is given in 1/(profile time unit).

Both R_F and M_F are sums over workers, so step deltas re-evaluate only the changed worker's term
(DESIGN §3.12). Bytes (what the planner's budget is compared against) live in :mod:`ferret_core.planning.memory_model`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from ferret_core.errors import ProfileError
from ferret_core.plan import Partition, backprop_period
from ferret_core.profile import LayerProfile, ModelProfile


@dataclass(frozen=True)
class StageGeometry:
    """Per-stage quantities of a partition (notation table of the paper)."""

    partition: Partition
    t_f: float  # t^f = max_j Σ_{i∈stage j} t̂_i^f
    t_b: float  # t^b = max_j Σ_{i∈stage j} t̂_i^b
    weights: tuple[int, ...]  # |w_j|
    activations: tuple[int, ...]  # |a_j|
    recompute_savings: tuple[int, ...]  # Σ_{l=L_j+1}^{L_{j+1}−1} |â_l| (what T1 frees, eq. ferret-svre)
    saved: tuple[int, ...]  # autograd saved-tensor elements per item (engine model; |a_j| if unprofiled)
    stage_inputs: tuple[int, ...]  # elements of the stage's input (what T1 keeps in the engine)
    outputs: tuple[int, ...] = ()  # elements of the stage's output (the next stage's input)
    graph_internal: tuple[int, ...] = ()  # a stage graph's saved storages besides its input and output
    forward_times: tuple[float, ...] = ()  # Σ t̂^f of each stage
    backward_times: tuple[float, ...] = ()  # Σ t̂^b of each stage

    @classmethod
    def from_profile(cls, profile: ModelProfile, partition: Partition) -> StageGeometry:
        if partition.num_units != profile.num_units:
            raise ProfileError(
                f"partition covers {partition.num_units} units but the profile of {profile.model!r} has "
                f"{profile.num_units}; re-plan with the model's own profile"
            )
        layers = profile.layers
        stages = partition.stages
        t_f = max(sum(layers[u].t_f for u in stage) for stage in stages)
        t_b = max(sum(layers[u].t_b for u in stage) for stage in stages)
        weights = tuple(sum(layers[u].params for u in stage) for stage in stages)
        activations = tuple(sum(layers[u].activations for u in stage) for stage in stages)
        savings = tuple(sum(layers[u].activations for u in stage[1:]) for stage in stages)
        saved = tuple(sum(_saved_elements(layers[u]) for u in stage) for stage in stages)
        inputs = tuple(
            profile.input_elements if stage[0] == 0 else layers[stage[0] - 1].activations for stage in stages
        )
        outputs = tuple(layers[stage[-1]].activations for stage in stages)
        internal = tuple(_graph_internal(profile, stage) for stage in stages)
        forward_times = tuple(sum(layers[u].t_f for u in stage) for stage in stages)
        backward_times = tuple(sum(layers[u].t_b for u in stage) for stage in stages)
        return cls(
            partition, t_f, t_b, weights, activations, savings, saved, inputs, outputs, internal,
            forward_times, backward_times,
        )

    @property
    def num_stages(self) -> int:
        return self.partition.num_stages

    def per_step(self, batch: int) -> StageGeometry:
        """The geometry of a step of ``batch`` items (a mini-batch or an item with replayed items): the
        per-item activation quantities times ``batch``; weights and times unchanged."""
        if batch == 1:
            return self
        return dataclasses.replace(
            self,
            activations=tuple(a * batch for a in self.activations),
            recompute_savings=tuple(a * batch for a in self.recompute_savings),
            saved=tuple(a * batch for a in self.saved),
            stage_inputs=tuple(a * batch for a in self.stage_inputs),
            outputs=tuple(a * batch for a in self.outputs),
            graph_internal=tuple(a * batch for a in self.graph_internal),
        )

    @property
    def total_weights(self) -> int:
        return sum(self.weights)

    def worker_time(self, recompute: bool) -> float:
        """t^f + t^b + c^r·t^f: one item's stage occupancy (Alg. 2, line 2)."""
        return self.t_f + self.t_b + (self.t_f if recompute else 0.0)

    def with_compensation(self, seconds_per_weight: float) -> StageGeometry:
        """The geometry of a plan whose gradients arrive stale (reading 14 of ``docs/planner.md``; ours, not
        in the paper): each stage's backward also compensates its gradient, ``seconds_per_weight`` × |w_j|
        (elementwise work over the stage's weights), so t^b = max_j (Σ t̂^b + that) in R_F and Alg. 2's N."""
        if seconds_per_weight == 0.0:
            return self
        if not (math.isfinite(seconds_per_weight) and seconds_per_weight > 0):
            raise ProfileError(f"compensation time per weight must be >= 0 seconds, got {seconds_per_weight}")
        backward = tuple(b + seconds_per_weight * w for b, w in zip(self.backward_times, self.weights, strict=True))
        return dataclasses.replace(self, t_b=max(backward), backward_times=backward)


def _saved_elements(layer: LayerProfile) -> int:
    return layer.activations if layer.saved is None else layer.saved


def _graph_internal(profile: ModelProfile, stage: tuple[int, ...]) -> int:
    """Elements of the distinct storages a stage's graph saves, besides the stage's input and output.

    Unit u's saved tensors are its input (when ``saved_input``), its output (``saved_output``) and the rest;
    a storage between two units of the stage is saved once if either keeps it. Without the flags every
    unit's saved tensors count whole and every inner boundary once more (an upper bound).
    """
    layers = profile.layers
    total = 0
    for position, u in enumerate(stage):
        layer = layers[u]
        saved = _saved_elements(layer)
        if layer.saved_input is None or layer.saved_output is None:
            total += saved + (layer.activations if position + 1 < len(stage) else 0)
            continue
        unit_input = profile.input_elements if u == 0 else layers[u - 1].activations
        total += max(0, saved - layer.saved_input * unit_input - layer.saved_output * layer.activations)
        if position + 1 < len(stage):
            following = layers[u + 1]
            if layer.saved_output or following.saved_input is None or following.saved_input:
                total += layer.activations
    return total


def num_worker_slots(geometry: StageGeometry, arrival_interval: float, recompute: bool) -> int:
    """N = ⌈(t^f + t^b + c^r t^f) / t^d⌉ (Alg. 2), computed as ⌈x − 1e-9⌉ (DESIGN §3.6)."""
    return max(1, math.ceil(geometry.worker_time(recompute) / arrival_interval - 1e-9))


def stored_versions(num_stages: int, stage: int, accumulation: int, omission: int) -> int:
    """1 + ⌈(P − i − 1)/c^a_{n,i}⌉ − c^o_{n,i}: model versions stage i of a worker keeps (eq. ferret-svre)."""
    return 1 + math.ceil((num_stages - stage - 1) / accumulation) - omission


class RateModel:
    """R_F of eq. ferret-svre for one geometry and decay constant c (V_D = 1).

    The inner sums Σ_{j<c^a} e^{−c(...)} are tabulated once per (c^r, stage) so a worker term costs O(P).
    """

    def __init__(self, geometry: StageGeometry, decay: float) -> None:
        self.geometry = geometry
        self.decay = decay
        p = geometry.num_stages
        total = geometry.total_weights
        if total <= 0:
            raise ProfileError("the model has no parameters: the adaptation rate is undefined")
        self._share = tuple(w / total for w in geometry.weights)
        # _prefix[r][i][k] = Σ_{j=0}^{k-1} exp(−c((P+j)t^f + (P−i+j)t^b + r(P−i+j)t^f))
        self._prefix: tuple[tuple[tuple[float, ...], ...], ...] = tuple(
            tuple(self._prefix_sums(r, i, p) for i in range(p)) for r in (0, 1)
        )

    def _prefix_sums(self, r: int, i: int, p: int) -> tuple[float, ...]:
        g = self.geometry
        sums = [0.0]
        for j in range(p):
            exponent = (p + j) * g.t_f + (p - i + j) * g.t_b + r * (p - i + j) * g.t_f
            sums.append(sums[-1] + math.exp(-self.decay * exponent))
        return tuple(sums)

    def stage_term(self, stage: int, recompute: bool, accumulation: int, period: int) -> float:
        """(|w_i|/Σ|w|)·(1/c^a)·Σ_{j<c^a} A_{i,j} with A's LCM factor = ``period`` (eq. ferret-svre)."""
        r = 1 if recompute else 0
        inner = self._prefix[r][stage][accumulation]
        time = self.geometry.worker_time(recompute)
        return self._share[stage] * (inner / accumulation) / (period * time)

    def worker_rate(self, recompute: bool, accumulation: tuple[int, ...], omission: tuple[int, ...]) -> float:
        """Worker n's term of R_F (eq. ferret-svre); 0 for a removed worker is the caller's job."""
        return sum(
            self.stage_term(i, recompute, accumulation[i], backprop_period(omission, i))
            for i in range(self.geometry.num_stages)
        )


def paper_worker_elements(
    geometry: StageGeometry, recompute: bool, accumulation: tuple[int, ...], omission: tuple[int, ...]
) -> int:
    """Worker n's term of M_F in elements (eq. ferret-svre):
    Σ_i (1 + ⌈(P−i−1)/c^a⌉ − c^o)(|w_i| + |a_i| − c^r Σ_{l=L_i+1}^{L_{i+1}−1} |â_l|)."""
    p = geometry.num_stages
    r = 1 if recompute else 0
    return sum(
        stored_versions(p, i, accumulation[i], omission[i])
        * (geometry.weights[i] + geometry.activations[i] - r * geometry.recompute_savings[i])
        for i in range(p)
    )
