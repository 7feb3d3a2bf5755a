"""Ferret's iterative compensation in one step from what the engine already holds:
``iter-fisher-lean``.

Alg. 1 (``alg:iterative-gradients-compensation``) iterates, over the τ master deltas Δ_k since the
gradient's version (kept in a delta ring),

    g_k = g_{k−1} + λ·g_{k−1}⊙g_{k−1}⊙Δ_k,   k = 1..τ.

The deltas telescope, Σ_k Δ_k = θ_now − θ_then, and g_{k−1} = g_0 + O(λ·g⊙g⊙Δ), so

    g_τ = g_0 + λ·g_0⊙g_0⊙(θ_now − θ_then) + (terms of second order in λ·g⊙g⊙Δθ),

i.e. eq. gt-taylor-expansion-approximation applied once across the whole gap, with θ_then = the item's
stash and θ_now = the master — both of which the engine holds anyway (DESIGN §3.13). No delta ring, no
``observe_update``. The difference from the iterated form is shown numerically in
``tests/unit/test_compensation_lean.py`` and ``benchmarks/engine/results/compensators.md``.

λ is per stage and tuned online exactly as Alg. 1 does (lines 3–7, DESIGN §3.3: gradient descent on eq.
lambda-objective-v1 with the EMAs v_r of g and v_a of g⊙g⊙Δ_1), with one change: Δ_1, the first delta
after the gradient's version, which only the ring knows, is replaced by the mean step over the gap,
(θ_now − θ_then)/τ (equal to Δ_1 when τ = 1, and in expectation when the steps are alike). With η_λ = 0,
λ = λ⁰ and the compensator holds no per-parameter state at all; with η_λ > 0 it holds v_r and v_a
(2 copies of the stage's parameters) against Iter-Fisher's v_r, v_a and ring.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings
from ferret_core.compensation.fisher import fisher_step, fisher_step_from
from ferret_core.compensation.iter_fisher import IterFisherCompensator


class IterFisherLeanCompensator(IterFisherCompensator):
    """Ferret (CVPR 2025), Alg. 1 in its one-step form: ``g + λ·g⊙g⊙(θ_now − θ_then)`` with λ tuned per
    stage as Alg. 1 tunes it (see the module docstring). ``ring_capacity`` (the stage's staleness bound)
    keeps no ring; 0 means the stage is never stale, and then v_r, v_a are not allocated."""

    name = "iter-fisher-lean"
    needs_deltas = False
    keeps_ring = False

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int = 1) -> None:
        super().__init__(params, settings, ring_capacity)  # the bound: > 0 keeps v_r, v_a; no ring either way

    def _observe(self, delta: Sequence[Tensor]) -> None:
        return None  # θ_now − θ_then comes from the versions, not from a record of updates

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if staleness == 0:  # a fresh gradient does not enter Alg. 1: λ, v_r, v_a unchanged (as Iter-Fisher)
            return grads
        gap = list(torch._foreach_sub(list(theta_now), list(theta_then)))  # Σ_k Δ_k
        if staleness == 1:  # Δ_1 is the gap: λ's EMA and the step share g⊙Δ, computed once in place (same bits)
            torch._foreach_mul_(gap, grads)  # g⊙Δ
            if self._tuned:
                self._tune(grads, None, grad_delta=gap)
            return fisher_step_from(grads, gap, self._lam)
        if self._tuned:
            self._tune(grads, list(torch._foreach_div(gap, float(staleness))) if staleness > 1 else gap)
        return fisher_step(grads, gap, self._lam)  # eq. gt-taylor-expansion-approximation over the gap
