"""One-shot Fisher delay compensation: DC-ASGD (Zheng et al., ICML 2017) as used by SAPipe (Chen et al.,
NeurIPS 2022), and the approximator A_I it shares with Ferret's iterative compensation.

A first-order Taylor expansion of the gradient around the stale version (eq. gt-taylor-expansion), with
the Hessian replaced by the λ-scaled diagonal empirical Fisher g⊙g (eq. fisher-approximation), gives
eq. gt-taylor-expansion-approximation:

    A_I(g, θ', θ) = g + λ·g⊙g⊙(θ' − θ).

The one-shot compensator applies it once across the whole gap, Δθ = θ_now − θ_then, with a fixed,
manually tuned λ (``CompensatorSettings.fisher_lambda``, a setting, so not part of snapshots); it holds
no per-parameter state.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings, StageCompensator


def fisher_step(
    grads: list[Tensor], deltas: Sequence[Tensor], lam: float | Tensor, *, inplace: bool = False
) -> list[Tensor]:
    """A_I of eq. gt-taylor-expansion-approximation for a whole stage: ``g + λ·g⊙g⊙Δ`` per parameter.

    Computed as ``g + g⊙(λ·g⊙Δ)`` with multi-tensor (``torch._foreach_*``) kernels: a handful of
    launches per stage, not per parameter. ``lam`` may be a 0-dim tensor on the stage's device (no host
    synchronisation). With ``inplace`` the result overwrites ``grads`` (for the iteration's own
    intermediates, never for a caller's gradient). ``grads`` must not be empty.
    """
    return fisher_step_from(grads, list(torch._foreach_mul(grads, list(deltas))), lam, inplace=inplace)


def fisher_step_from(
    grads: list[Tensor], grad_delta: list[Tensor], lam: float | Tensor, *, inplace: bool = False
) -> list[Tensor]:
    """:func:`fisher_step` from ``grad_delta`` = g⊙Δ already computed (it is overwritten: the caller's
    temporary), the same arithmetic in the same order, so the same bits."""
    term = grad_delta
    value = 1.0
    if isinstance(lam, Tensor):
        torch._foreach_mul_(term, lam)
    else:
        value = float(lam)
    if inplace:
        torch._foreach_addcmul_(grads, grads, term, value=value)
        return grads
    return list(torch._foreach_addcmul(grads, grads, term, value=value))


class FisherCompensator(StageCompensator):
    """DC-ASGD / SAPipe: ``g + λ·g⊙g⊙(θ_now − θ_then)`` in one step, λ = ``settings.fisher_lambda``."""

    name = "fisher"

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings) -> None:
        super().__init__(params, settings)
        self._lam = float(settings.fisher_lambda)

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if staleness == 0:
            return grads
        # eq. gt-taylor-expansion-approximation with Δθ = θ_now − θ_then
        return fisher_step(grads, torch._foreach_sub(list(theta_now), list(theta_then)), self._lam)

    def _lambda(self) -> float:
        return self._lam
