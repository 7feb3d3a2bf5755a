"""Compensator state across a re-plan (DESIGN §3.3, §3.13): what a new pipeline keeps of the old one's.

A re-plan drains the pipeline and builds a new one from the master weights: its versions restart at 0,
and its compensators are built for the new plan (ring capacities follow the new schedule's staleness
bounds). :func:`carry_compensator_states` turns the old stages' ``state_dict()`` into states the new
compensators load, keeping what they can use:

* **per-parameter tensors** (Iter-Fisher's v_r and v_a, Gap-Aware's average step C): always. The stage
  lists are concatenated in model order (stage j holds the parameters of its units, in unit order) and
  re-split at the new stage boundaries, so every parameter keeps its own values whichever stage holds it;
* **λ per stage**: as is when the partition is unchanged; otherwise each new stage takes the mean of the
  old stages' λ weighted by the parameter elements it took from each (a new stage whose parameters all
  come from one old stage keeps that λ exactly; a stage without parameters keeps λ⁰);
* **Gap-Aware's update count n** (its bias correction 1 − α^n belongs to C; likewise DC-ASGD-a's ``seen``
  for MeanSquare): as is, or the smallest n of the old stages a new stage's parameters came from (the
  larger correction, never a smaller one);
* a stage that keeps no per-parameter state on one side (its staleness bound is 0 in that plan, so the
  compensator allocated none) starts that state fresh;
* **statistics** (calls, compensated, truncated, correction sum): as is when the partition is unchanged;
  otherwise they restart (a new stage has no history).

**The delta ring starts empty**: after the drain every gradient is computed on a version of the new
pipeline, so its staleness τ counts only updates made after the re-plan, and Alg. 1 walks only the deltas
Δ_1..Δ_τ since that version: the deltas from before the re-plan are never read again. Any other state a
compensator keeps restarts from its fresh value: state this module does not know cannot be re-split
safely.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ferret_core.errors import ConfigError, ScheduleError

STATISTICS = ("calls", "compensated", "truncated", "correction_sum")
_LAMBDA = "lambda"
_COUNTS = ("updates", "seen")  # EMA step counts of the bias corrections: Gap-Aware's C, DC-ASGD-a's MeanSquare


def _per_parameter(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(t, Tensor) for t in value)


def _alike(mine: object, theirs: object) -> bool:
    """Whether both are per-parameter tensor lists of the same shapes."""
    if not (_per_parameter(mine) and _per_parameter(theirs)):
        return False
    assert isinstance(mine, list) and isinstance(theirs, list)
    return [tuple(t.shape) for t in mine] == [tuple(t.shape) for t in theirs]


def _sources(old: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> list[tuple[int, int]] | None:
    """(old stage, elements) of every parameter in model order, from a per-parameter key every old stage
    has; None when no such key exists (then parameter boundaries are unknown)."""
    for key in keys:
        if all(_per_parameter(state.get(key)) for state in old):
            return [(j, t.numel()) for j, state in enumerate(old) for t in state[key]]
    return None


def carry_compensator_states(
    old: Sequence[Mapping[str, Any]], fresh: Sequence[Mapping[str, Any]], *, same_partition: bool
) -> list[dict[str, Any]]:
    """States for the new stages' compensators (module docstring): ``old`` from the drained pipeline,
    ``fresh`` the new compensators' own ``state_dict()`` (their shapes, ring capacities and defaults);
    ``same_partition``: the stage boundaries did not move. Tensors are shared with ``old``, not copied:
    ``load_state_dict`` copies them."""
    names = {state.get("name") for state in (*old, *fresh)}
    if len(names) != 1:
        raise ConfigError(
            f"cannot carry compensator state between different compensators {sorted(map(str, names))}; "
            "a re-plan keeps the trainer's compensator"
        )
    if same_partition and len(old) != len(fresh):
        raise ScheduleError(f"same partition but {len(old)} old stages and {len(fresh)} new ones")
    keys = [k for k in fresh[0] if any(_per_parameter(state.get(k)) for state in fresh)]
    sources = _sources(old, keys)
    sizes = [len(next((state[k] for k in keys if _per_parameter(state.get(k))), [])) for state in fresh]
    out = [dict(state) for state in fresh]
    for key in keys:
        if same_partition:  # stage by stage: a stage that keeps none on one side (never stale) starts fresh
            for state, previous in zip(out, old, strict=True):
                mine, theirs = state.get(key), previous.get(key)
                if _alike(mine, theirs):
                    state[key] = theirs
            continue
        if not all(_per_parameter(state.get(key)) for state in old):
            continue  # the old compensator did not keep it (e.g. λ fixed): the new one starts fresh
        flat = [t for state in old for t in state[key]]
        shapes = [tuple(t.shape) for state in fresh for t in (state.get(key) or [])]
        if [tuple(t.shape) for t in flat] != shapes:
            continue  # not the same parameters: nothing can be carried safely
        start = 0
        for state, size in zip(out, sizes, strict=True):
            state[key] = flat[start : start + size]
            start += size
    if same_partition:
        for state, previous in zip(out, old, strict=True):
            for key in (_LAMBDA, *_COUNTS, *STATISTICS):
                if key in state and key in previous:
                    state[key] = previous[key]
        return out
    if sources is None or len(sources) != sum(sizes):
        return out  # parameter boundaries unknown: only what was re-split above carries
    start = 0
    for state, size in zip(out, sizes, strict=True):
        taken = sources[start : start + size]
        start += size
        if not taken:
            continue
        if _LAMBDA in state:
            state[_LAMBDA] = _weighted_lambda(old, taken, default=state[_LAMBDA])
        for count in _COUNTS:
            if count in state and all(count in old[j] for j, _ in taken):
                state[count] = min(int(old[j][count]) for j, _ in taken)
    return out


def same_stages(old: Sequence[Mapping[str, Any]], fresh: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``old`` (a snapshot's states, whose plan is not at hand) looks like the same partition as
    ``fresh``: as many stages, and every per-parameter tensor both keep shaped alike stage by stage (a
    stage that keeps none on one side, never stale there, cannot tell and does not object)."""
    if len(old) != len(fresh):
        return False
    for previous, state in zip(old, fresh, strict=True):
        for key, mine in state.items():
            theirs = previous.get(key)
            if _per_parameter(mine) and _per_parameter(theirs) and not _alike(mine, theirs):
                return False
    return True


def _weighted_lambda(old: Sequence[Mapping[str, Any]], taken: Sequence[tuple[int, int]], default: Any) -> Any:
    """Σ_j n_j·λ_j / Σ_j n_j over the old stages j a new stage took n_j parameter elements from (one
    source stage: its λ exactly, no rounding)."""
    weights: dict[int, int] = {}
    for j, n in taken:
        weights[j] = weights.get(j, 0) + n
    if len(weights) == 1:
        return old[next(iter(weights))][_LAMBDA]
    total = sum(weights.values())
    lam = sum(float(old[j][_LAMBDA]) * n for j, n in weights.items()) / total if total else math.nan
    return lam if math.isfinite(lam) else default
