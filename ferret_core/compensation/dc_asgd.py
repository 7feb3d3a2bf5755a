"""DC-ASGD's adaptive delay compensation: ``dc-asgd-a``.

Zheng, Meng, Wang, Chen, Yu, Ma and Liu, "Asynchronous Stochastic Gradient Descent with Delay
Compensation", ICML 2017, §5 (DC-ASGD-a). A gradient g computed on θ_then and applied at θ_now is
corrected, elementwise, by the λ-scaled diagonal of the outer product of gradients (their eq. 9, the
same Taylor step as Ferret's eq. gt-taylor-expansion-approximation) with λ made adaptive:

    MeanSquare(t) = m·MeanSquare(t−1) + (1−m)·g⊙g                     (DC-ASGD-a, m ≈ 0.95)
    λ_t = λ₀ / √(MeanSquare(t) + ε)
    g_out = g + λ_t ⊙ g⊙g⊙(θ_now − θ_then)

Dividing by the running root mean square makes the correction's size independent of the gradient's
scale: g⊙g/√MeanSquare ≈ |g|, so ‖g_out − g‖/‖g‖ ≈ λ₀·|θ_now − θ_then| per element, where Ferret's fixed
λ = 0.2 leaves ≈ 0.2·g²·|Δθ| (docs/compensation.md measures both on MNISTNet: the unnormalised one is
about 1e-3 of the gradient or less).

Readings (ours): MeanSquare is updated with every gradient of the stage, stale or fresh (the paper's
MeanSquare is over all gradients the server receives); it starts at zero and is bias-corrected as
Adam's second moment, MeanSquare/(1 − m^t) — the paper does not say how it starts, and without the
correction λ_t would be √(1/(1−m)) ≈ 4.5 times λ₀ on the first gradient. A fresh gradient (τ = 0) is
returned as it is. λ₀ defaults to 10, not 2 (the paper's CIFAR-10 value as we read it, at a learning rate
of about 0.5): the correction is ≈ λ₀·|Δθ| ∝ λ₀·lr, and the short streams here run lr 0.02; 10 was
chosen on MNIST/Split-MNIST seeds 0–4 among {2, 10, 40} and confirmed on held-out seeds 5–9 and
Fashion-MNIST (docs/compensation.md §4).

**The bound (ours).** The paper's correction is unbounded: a gradient element far above its running root
mean square (a new class's first gradients) is corrected by a large factor, the corrected step moves the
weights further, the next stale gradients see a larger θ_now − θ_then, and the corrections feed on
themselves. Measured at λ₀ = 10, lr 0.02, 1 × 5 workers, 1,000 items: the corrections became non-finite
on 2 of 5 Split-MNIST seeds and 1 of 5 Split-FMNIST seeds, and those runs stopped learning (test accuracy
at chance; docs/compensation.md §5). So each element's correction is clipped to κ times the gradient
element's own magnitude:

    g_out = g + clamp(λ_t ⊙ g⊙g⊙(θ_now − θ_then), −κ|g|, κ|g|)                   (κ = dc_bound, 1)

With κ = 1 a correction can at most double an element of the gradient or cancel it, never reverse it: a
first-order Taylor step larger than the gradient it corrects is outside the range where the expansion
means anything. At the median sizes measured (‖c‖/‖g‖ ≈ 0.1) it binds only on outliers.
``dc_bound = math.inf`` is the paper's unbounded form.

Settings: ``CompensatorSettings.dc_lambda0`` (λ₀), ``dc_momentum`` (m), ``dc_eps`` (ε), ``dc_bound`` (κ).

State: MeanSquare, one copy of the stage's parameters, and a step counter — allocated only where the
stage can be stale (``ring_capacity`` > 0, the stage's staleness bound under the plan): a stage whose
gradients are never stale holds nothing, and a stale gradient reaching it anyway is returned unchanged
and counted as ``truncated``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.errors import ConfigError


class DcAsgdAdaptiveCompensator(StageCompensator):
    """DC-ASGD-a (Zheng et al., ICML 2017): ``g + λ₀/√(MeanSquare + ε) ⊙ g⊙g⊙(θ_now − θ_then)``, each
    element's correction bounded by ``dc_bound``·|g| (ours; the module docstring)."""

    name = "dc-asgd-a"

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int) -> None:
        super().__init__(params, settings)
        self.active = ring_capacity > 0  # the stage can be stale under the plan: keep MeanSquare
        self._mean_square: list[Tensor] = []
        if self.active:
            self._mean_square = [
                torch.zeros(s, dtype=d, device=self._device) for s, d in zip(self._shapes, self._dtypes, strict=True)
            ]
        # gradients folded into MeanSquare (for the bias correction): one int64 on the host (a read is no
        # device sync), a view of shared memory once :meth:`share_tuning_state` is called
        self._seen_count: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(1, dtype=np.int64)

    @property
    def _seen(self) -> int:
        return int(self._seen_count[0])

    @_seen.setter
    def _seen(self, count: int) -> None:
        self._seen_count[0] = count

    def tuning_state(self) -> list[Tensor]:
        """The count of gradients folded (int64 of shape (1,), host) and MeanSquare, where the stage can be
        stale; else nothing."""
        if not self.active:
            return []
        return [torch.from_numpy(self._seen_count), *self._mean_square]

    def _adopt_tuning_state(self, tensors: list[Tensor]) -> None:
        self._seen_count = tensors[0].numpy()
        self._mean_square = tensors[1:]

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if not self.active:
            if staleness > 0:
                self._truncated += 1  # no state kept where the plan has no staleness: applied as is
            return grads
        s = self.settings
        momentum = s.dc_momentum
        # MeanSquare(t) = m·MeanSquare(t−1) + (1−m)·g⊙g
        torch._foreach_mul_(self._mean_square, momentum)
        torch._foreach_addcmul_(self._mean_square, grads, grads, value=1.0 - momentum)
        self._seen += 1
        if staleness == 0 or s.dc_lambda0 == 0:
            return grads
        # √(MeanSquare/(1 − m^t) + ε): the bias-corrected root mean square (module docstring)
        root = list(torch._foreach_div(self._mean_square, 1.0 - momentum**self._seen))
        torch._foreach_add_(root, s.dc_eps)
        torch._foreach_sqrt_(root)
        term = list(torch._foreach_sub(list(theta_now), list(theta_then)))  # θ_now − θ_then
        torch._foreach_mul_(term, grads)  # g⊙Δθ
        torch._foreach_mul_(term, grads)  # g⊙g⊙Δθ
        torch._foreach_div_(term, root)  # λ_t/λ₀ ⊙ g⊙g⊙Δθ
        if math.isinf(s.dc_bound):
            return list(torch._foreach_add(grads, term, alpha=s.dc_lambda0))
        torch._foreach_mul_(term, s.dc_lambda0)  # λ_t ⊙ g⊙g⊙Δθ
        limit = list(torch._foreach_abs(grads))
        if s.dc_bound != 1.0:  # (× 1 is exact: skipped)
            torch._foreach_mul_(limit, s.dc_bound)  # κ|g|
        low = list(torch._foreach_neg(limit))
        for t, lo, hi in zip(term, low, limit, strict=True):  # clamp(·, −κ|g|, κ|g|): the bound (module docstring)
            torch.clamp(t, min=lo, max=hi, out=t)
        return list(torch._foreach_add(grads, term))

    def _lambda(self) -> float:
        return float(self.settings.dc_lambda0)

    def state_storages(self) -> list[tuple[int, int]]:
        fixed = [*self._mean_square]
        if self._correction_device is not None:
            fixed.append(self._correction_device)
        return [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in fixed]

    def _extra_tensors(self) -> list[Tensor]:
        return list(self._mean_square)

    def _extra_state(self) -> dict[str, Any]:
        return {"mean_square": [t.clone() for t in self._mean_square] if self.active else None, "seen": self._seen}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """MeanSquare and its count; a snapshot of an inactive stage (None) restarts them from zero."""
        src = state["mean_square"]
        seen = int(state["seen"])
        if not self.active:
            self._seen = 0
            return
        if src is None:
            for t in self._mean_square:
                t.zero_()
            self._seen = 0
            return
        got = [tuple(t.shape) for t in src]
        if got != list(self._shapes):
            raise ConfigError(
                f"dc-asgd-a snapshot mean_square shapes {got} do not match the stage's parameters {list(self._shapes)}"
            )
        for d, t in zip(self._mean_square, src, strict=True):
            d.copy_(t)
        self._seen = seen
