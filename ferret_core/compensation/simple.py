"""Penalty compensators, which shrink a stale gradient instead of correcting it: None, Step-Aware and
Gap-Aware (the baselines of the paper's "Comparisons on Gradients Compensation").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.errors import ConfigError


class NoCompensator(StageCompensator):
    """No compensation: the stale gradient is applied as is (PipeDream, Narayanan et al. 2019; the
    zero-order Taylor expansion the paper starts from)."""

    name = "none"

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        return grads

    def _correction(self, out: Sequence[Tensor], grads: Sequence[Tensor], staleness: int) -> float:
        return 0.0


class StepAwareCompensator(StageCompensator):
    """Staleness-aware SGD (Zhang et al., IJCAI 2016, "Staleness-aware Async-SGD for Distributed Deep
    Learning"; also Hardy et al. 2017, Jiang et al. 2017): the gradient is divided by its staleness,
    ``g / max(1, τ)`` — the learning rate modulated by 1/τ."""

    name = "step-aware"

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if staleness <= 1:
            return grads
        return list(torch._foreach_div(grads, float(staleness)))

    def _correction(self, out: Sequence[Tensor], grads: Sequence[Tensor], staleness: int) -> float:
        # ‖g/τ − g‖ / ‖g‖ = 1 − 1/τ exactly (for g ≠ 0); known on the host, no device work.
        return 1.0 - 1.0 / max(1, staleness)


class GapAwareCompensator(StageCompensator):
    """Gap-Aware (Barkai, Hakimi and Schuster, ICLR 2020, "Gap-Aware Mitigation of Gradient Staleness").

    The *gap* of a stale gradient is how far each parameter moved while the gradient was in flight,
    measured in units of a typical single step. Exactly what we implement, elementwise:

        C ← α·C + (1 − α)·|Δθ|                  on every master update (``observe_update``)
        Ĉ = C / (1 − α^n)                       bias-corrected average step after n updates
        G = max(1, |θ_now − θ_then| / (Ĉ + ε))  the gap, ε = ``settings.gap_eps``
        g_out = g / G

    So a parameter that moved no more than one average step is left untouched, and one that moved k
    average steps gets its gradient divided by k (for τ consistent steps in one direction, G ≈ τ, i.e.
    Step-Aware's penalty; parameters that barely moved are not over-penalised — the paper's argument).
    α is ``settings.alpha``. Before any update has been observed there is no step scale, and the
    gradient is returned unchanged. State: one tensor C per parameter, only where the stage's staleness
    bound (``ring_capacity``) is > 0, and the count n.

    C and n are the fold of *every* master update of the stage, whoever made it. The thread engine keeps
    one compensator per stage, so its own C sees them all; executor processes keep one compensator per
    executor, so C and n live in the stage's shared memory (:meth:`share_average`,
    :mod:`ferret_core.engine.processes.average`): the executor that updates the master folds θ_new − θ_old
    into them with :meth:`observe_update`, every executor of the stage reads them when it compensates,
    both under the stage's update lock. The same code folds and reads either storage, so both give the
    same C, Ĉ and g_out for the same sequence of updates.
    """

    name = "gap-aware"

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int = 1) -> None:
        super().__init__(params, settings)
        # C only where the stage can be stale (``ring_capacity``, its staleness bound, > 0): a stage whose
        # gradients are never stale would update C and never read it
        self.active = ring_capacity > 0
        self._avg_step = (
            [torch.zeros_like(p.detach(), memory_format=torch.preserve_format) for p in params] if self.active else []
        )
        # n, the updates folded into C: one int64 on the host (a read is no device sync), a view of shared
        # memory once :meth:`share_average` is called
        self._count: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(1, dtype=np.int64)

    needs_deltas = True
    keeps_average = True

    @property
    def _updates(self) -> int:
        return int(self._count[0])

    @property
    def folded_updates(self) -> int:
        """n, the master's updates folded into C so far (every executor's of the stage, when shared)."""
        return self._updates

    def share_average(self, average: Sequence[Tensor], count: Tensor) -> None:
        """Before the first update: keep C in ``average`` and n in ``count`` (storage another owner
        allocated and other processes fold into: the stage's shared average on executor processes) instead
        of this compensator's own. Fold and read it under one lock (the stage's update lock)."""
        if not self.active:
            raise ConfigError(
                f"{self.name}: this stage is never stale (ring_capacity 0) and keeps no C; share no average with it"
            )
        if self._updates:
            raise ConfigError(f"{self.name}: share an average before the first update, this one folded {self._updates}")
        mine = [(tuple(t.shape), t.dtype) for t in self._avg_step]
        given = [(tuple(t.shape), t.dtype) for t in average]
        if given != mine:
            raise ConfigError(
                f"{self.name}: a shared average must be shaped as the stage's parameters {mine}, got {given}"
            )
        if count.dtype != torch.int64 or tuple(count.shape) != (1,):
            raise ConfigError(
                f"{self.name}: a shared update count is an int64 tensor of shape (1,), got {count.dtype} "
                f"{tuple(count.shape)}"
            )
        self._avg_step = list(average)
        self._count = count.numpy()
        self.state_generation += 1

    def _observe(self, delta: Sequence[Tensor]) -> None:
        if not self.active:
            return
        torch._foreach_lerp_(self._avg_step, torch._foreach_abs(list(delta)), 1.0 - self.settings.alpha)
        self._count[0] += 1

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if staleness > 0 and not self.active:
            self._truncated += 1  # no C kept where the plan has no staleness: applied as is
        if staleness == 0 or self._updates == 0:
            return grads
        bias = 1.0 - self.settings.alpha**self._updates
        eps = self.settings.gap_eps
        gap = list(torch._foreach_sub(list(theta_now), list(theta_then)))
        torch._foreach_abs_(gap)  # |θ_now − θ_then|
        scale = list(torch._foreach_div(self._avg_step, bias))  # Ĉ
        torch._foreach_add_(scale, eps)
        torch._foreach_div_(gap, scale)
        torch._foreach_clamp_min_(gap, 1.0)  # G
        return list(torch._foreach_div(grads, gap))

    def _extra_tensors(self) -> list[Tensor]:
        return list(self._avg_step)

    def _extra_state(self) -> dict[str, Any]:
        return {"avg_step": [t.clone() for t in self._avg_step] if self.active else None, "updates": self._updates}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        if not self.active or state["avg_step"] is None:  # C not kept on one side: it restarts
            for t in self._avg_step:
                t.zero_()
            self._count[0] = 0
            return
        avg_step = list(state["avg_step"])
        if [tuple(t.shape) for t in avg_step] != [tuple(t.shape) for t in self._avg_step]:
            raise ConfigError(
                f"gap-aware snapshot shapes {[tuple(t.shape) for t in avg_step]} do not match the stage's "
                f"parameters {[tuple(t.shape) for t in self._avg_step]}"
            )
        for dst, src in zip(self._avg_step, avg_step, strict=True):
            dst.copy_(src)
        self._count[0] = int(state["updates"])
