"""Ferret's iterative gradient compensation (paper §"Iterative Gradient Compensation", Alg. 1
``alg:iterative-gradients-compensation``), read as DESIGN §3.3 and §3.4 say.

For a gradient g computed on the stage's version t−1 and applied τ master updates later,

    g_0 = g;   g_k = A_I(g_{k−1}) = g_{k−1} + λ·g_{k−1}⊙g_{k−1}⊙Δ_k,   k = 1..τ      (Alg. 1 lines 8–9)

with Δ_k = θ^{t+k−1} − θ^{t+k−2} the stage's own master deltas since the gradient's version, oldest first,
kept in a :class:`~ferret_core.compensation.ring.DeltaRing`. When τ exceeds the ring, the most recent
deltas it still holds are used and the call is counted as ``truncated`` (cut short). The ring is sized
to the schedule's staleness bound; where the caller lets it follow the staleness really reached
(:meth:`IterFisherCompensator.follow_staleness`, the wall clock), a cut-short call also grows the ring
to τ (up to a limit), so the next gradient as stale is compensated in full.

λ is tuned per stage by gradient descent on eq. lambda-objective-v1 with the EMAs of Alg. 1 lines 3–7:

    Δv_r = (1−α)(g − v_r)
    λ ← λ − η_λ·∇_λ(‖Δv_r − λ·v_a‖² + ν·λ²) = λ + 2η_λ·(⟨Δv_r, v_a⟩ − λ‖v_a‖² − ν·λ)
    v_r ← α·v_r + (1−α)·g
    v_a ← α·v_a + (1−α)·g⊙g⊙Δ_1

Readings (DESIGN §3.3): λ, v_r and v_a persist across calls (the listing re-initialises them, which would
make tuning a no-op); the ν-term's gradient 2νλ is included (the listing's step omits it, the objective
has it); inner products sum over every element of the stage; Δ_1 = θ^t − θ^{t−1} is the first delta
after the gradient's version — the oldest delta the ring still holds when the call is truncated, zeros
when the ring holds none.

**A fresh gradient (τ = 0) does not enter Alg. 1** (ours; running lines 3–7 on every gradient would use
Δ_1 = 0): Alg. 1's input is a gradient computed on θ^{t−1} together with
θ^t, …, θ^{t+τ−1}, and line 7 reads Δ_1 = θ^t − θ^{t−1}, so it is defined for stale gradients, τ ≥ 1
(the paper's analysis fixes τ = 1). A τ = 0 gradient is returned as it is, and λ, v_r and v_a do not
change: λ steps once per *compensated* gradient, v_r is the EMA of the compensated (stale) gradients and
v_a that of their g⊙g⊙Δ_1. So a plan in which nothing is stale (one worker, one stage: every gradient
has τ = 0) pays nothing for compensation, and λ stays λ⁰ there.

With η_λ = 0, λ stays λ⁰ and v_r, v_a are not allocated (paper: "eliminates the need for
v_r and v_a"); nor are they on a stage whose staleness bound is 0 (``ring_capacity`` = 0: nothing there
is stale, so Alg. 1 never runs and they would stay zero). ``iter-fisher-cf`` replaces the gradient step
by the closed form λ* = ⟨Δv_r, v_a⟩ / (‖v_a‖² + ν) — a different algorithm, offered separately.

All scalars stay on the stage's device (λ as a 0-dim float64 tensor when tuned): no host sync per call.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.compensation.fisher import fisher_step, fisher_step_from
from ferret_core.compensation.ring import DeltaRing
from ferret_core.errors import ConfigError

_TINY = 1e-30


def _sum64(scalars: list[Tensor]) -> Tensor:
    """Σ of 0-dim tensors, accumulated in float64 on their device."""
    if len({t.dtype for t in scalars}) == 1:
        return torch.stack(scalars).to(torch.float64).sum()
    return torch.stack([t.to(torch.float64) for t in scalars]).sum()


class IterFisherCompensator(StageCompensator):
    """Ferret (CVPR 2025), Alg. 1: iterative Fisher compensation over the per-step deltas, λ tuned by
    gradient descent (η_λ = ``settings.eta_lambda``; 0 fixes λ = ``settings.lambda0``)."""

    name = "iter-fisher"

    keeps_ring: ClassVar[bool] = True  # Alg. 1 walks the per-update deltas (the lean form does not)

    def __init__(self, params: Sequence[Tensor], settings: CompensatorSettings, ring_capacity: int) -> None:
        super().__init__(params, settings)
        self._ring = DeltaRing(ring_capacity if self.keeps_ring else 0)
        # v_r, v_a only where the stage can be stale (its staleness bound ``ring_capacity`` > 0): a fresh
        # gradient never enters Alg. 1, so on a stage that is never stale they would never change
        self._tuned = ring_capacity > 0 and self._uses_ema()
        self._lam: float | Tensor = float(settings.lambda0)
        self._v_r: list[Tensor] = []
        self._v_a: list[Tensor] = []
        if self._tuned:
            self._lam = torch.tensor(float(settings.lambda0), dtype=torch.float64, device=self._device)
            self._v_r = [
                torch.zeros(s, dtype=d, device=self._device) for s, d in zip(self._shapes, self._dtypes, strict=True)
            ]
            self._v_a = [
                torch.zeros(s, dtype=d, device=self._device) for s, d in zip(self._shapes, self._dtypes, strict=True)
            ]
        # v_a is exactly 0 until a gradient comes with a Δ_1 (a ring holding a delta): until then every
        # call's ⟨Δv_r, v_a⟩, ‖v_a‖² and α·v_a are 0, so _tune skips those passes; λ and v_r are updated alike.
        # One int64 on the host (1 once v_a may be non-zero; a read is no device sync), a view of shared memory
        # once :meth:`share_tuning_state` is called
        self._v_a_seen: np.ndarray[Any, np.dtype[np.int64]] = np.zeros(1, dtype=np.int64)

    @property
    def _v_a_zero(self) -> bool:
        return not self._v_a_seen[0]

    @_v_a_zero.setter
    def _v_a_zero(self, zero: bool) -> None:
        self._v_a_seen[0] = 0 if zero else 1

    @property
    def ring(self) -> DeltaRing:
        """The stage's delta ring (read-only use)."""
        return self._ring

    def follow_staleness(self, limit: int) -> None:
        """Let the ring grow, up to ``limit`` deltas, to the staleness a cut-short call had."""
        self._ring.limit = max(self._ring.capacity, limit)

    def share_ring(self, ring: DeltaRing) -> None:
        """Before the first update: walk ``ring`` (the stage's ring that every executor process of the
        stage reads and the updater pushes to) instead of a ring of its own; it must hold as many deltas
        as this compensator was built for. λ, v_r and v_a are shared apart (:meth:`share_tuning_state`)."""
        if not self.keeps_ring:
            return  # the lean form reads the versions, not the deltas
        if self._ring.pushed or len(self._ring):
            raise ConfigError(f"{self.name}: share a ring before the first update, this one holds {len(self._ring)}")
        if ring.capacity != self._ring.capacity:
            raise ConfigError(
                f"{self.name}: the shared ring holds {ring.capacity} deltas, this compensator was built for "
                f"ring_capacity={self._ring.capacity}; size the shared ring to the stage's staleness bound"
            )
        self._ring = ring

    def tuning_state(self) -> list[Tensor]:
        """λ (0-dim float64), whether v_a may be non-zero (int64 of shape (1,), host), v_r and v_a — where λ is
        tuned at this stage; else nothing (λ is the setting λ⁰)."""
        if not self._tuned:
            return []
        assert isinstance(self._lam, Tensor)
        return [self._lam, torch.from_numpy(self._v_a_seen), *self._v_r, *self._v_a]

    def _adopt_tuning_state(self, tensors: list[Tensor]) -> None:
        k = len(self._v_r)
        self._lam = tensors[0]
        self._v_a_seen = tensors[1].numpy()
        self._v_r = tensors[2 : 2 + k]
        self._v_a = tensors[2 + k :]

    def fit_ring(self, capacity: int, limit: int) -> None:
        """Size the ring to the staleness the schedule reaches (``capacity``), growing up to ``limit``;
        only before the first update (the ring is empty)."""
        if self.keeps_ring and not self._ring.pushed:
            self._ring.refit(capacity, limit)

    def _uses_ema(self) -> bool:
        """Whether λ is tuned from v_r, v_a (and so whether they are allocated)."""
        return self.settings.eta_lambda > 0

    # --------------------------------------------------------------------------------- the two calls
    needs_deltas = True

    def _observe(self, delta: Sequence[Tensor]) -> None:
        self._ring.push(delta)

    def _compensate(
        self,
        grads: list[Tensor],
        staleness: int,
        theta_then: Sequence[Tensor],
        theta_now: Sequence[Tensor],
    ) -> list[Tensor]:
        if staleness == 0:  # a fresh gradient: not compensated, λ, v_r, v_a unchanged (module docstring)
            return grads
        deltas = self._ring.recent(staleness)  # Δ_1..Δ_τ, oldest first (or the most recent it holds)
        if len(deltas) < staleness:
            self._truncated += 1
            self._ring.grow(min(staleness, self._ring.limit))
        if not deltas:
            if self._tuned:
                self._tune(grads, None)
            return grads
        # g⊙Δ_1 feeds both λ's EMA v_a (line 7) and the first step (line 9): computed once (the same bits)
        grad_delta = list(torch._foreach_mul(grads, list(deltas[0])))
        if self._tuned:
            self._tune(grads, None, grad_delta=grad_delta)
        lam = self._lam
        # Alg. 1 lines 8–9: g_k = A_I(g_{k−1}, θ^{t+k−1}, θ^{t+k−2}), eq. gt-taylor-expansion-approximation
        out = fisher_step_from(grads, grad_delta, lam)
        for delta in deltas[1:]:
            out = fisher_step(out, delta, lam, inplace=True)
        return out

    # ------------------------------------------------------------------------------- λ and the EMAs
    def _tune(
        self, grads: list[Tensor], first: Sequence[Tensor] | None, grad_delta: list[Tensor] | None = None
    ) -> None:
        """Alg. 1 lines 3–7 with persistent state; ``first`` is Δ_1 (None stands for zeros), or ``grad_delta``
        is g⊙Δ_1 already computed (read, not changed)."""
        alpha = self.settings.alpha
        weight = 1.0 - alpha
        diff = list(torch._foreach_sub(grads, self._v_r))  # g − v_r = Δv_r / (1−α), old v_r
        if self._v_a_zero:  # v_a = 0 exactly (no Δ_1 seen yet): both sums are 0 and α·v_a = v_a, no passes
            zero = torch.zeros((), dtype=torch.float64, device=self._device)
            self._update_lambda(zero * weight, zero)
        else:
            cross = _sum64([d.reshape(-1).dot(a.reshape(-1)) for d, a in zip(diff, self._v_a, strict=True)])
            norm_sq = _sum64([a.reshape(-1).dot(a.reshape(-1)) for a in self._v_a])  # ‖v_a‖², old v_a
            self._update_lambda(cross * weight, norm_sq)  # λ from ⟨Δv_r, v_a⟩ and ‖v_a‖²
            torch._foreach_mul_(self._v_a, alpha)  # v_a ← α·v_a + (1−α)·g⊙g⊙Δ_1
        torch._foreach_add_(self._v_r, diff, alpha=weight)  # v_r ← α·v_r + (1−α)·g
        if grad_delta is None and first is not None:
            grad_delta = list(torch._foreach_mul(grads, list(first)))  # g⊙Δ_1
        if grad_delta is not None:
            torch._foreach_addcmul_(self._v_a, grads, grad_delta, value=weight)
            self._v_a_zero = False

    def _update_lambda(self, cross: Tensor, norm_sq: Tensor) -> None:
        """One gradient step on eq. lambda-objective-v1, ν-term included (DESIGN §3.3)."""
        assert isinstance(self._lam, Tensor)
        s = self.settings
        lam = self._lam
        grad = -2.0 * (cross - lam * norm_sq) + 2.0 * s.nu * lam  # ∇_λ(‖Δv_r − λv_a‖² + νλ²)
        lam.sub_(s.eta_lambda * grad)

    # ------------------------------------------------------------------------------ introspection
    def _lambda(self) -> float:
        return float(self._lam.item()) if isinstance(self._lam, Tensor) else self._lam

    def state_storages(self) -> list[tuple[int, int]]:
        """The ring's cached keys, and the EMAs', λ's and the correction accumulator's (fixed storages)."""
        fixed = [*self._v_r, *self._v_a]
        if isinstance(self._lam, Tensor):
            fixed.append(self._lam)
        if self._correction_device is not None:
            fixed.append(self._correction_device)
        keys = [(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()) for t in fixed]
        return [*self._ring.storages(), *keys]

    def _extra_tensors(self) -> list[Tensor]:
        tensors = [*self._ring.state_tensors(), *self._v_r, *self._v_a]
        if isinstance(self._lam, Tensor):
            tensors.append(self._lam)
        return tensors

    def _extra_state(self) -> dict[str, Any]:
        return {
            "lambda": self._lambda(),
            "ring": self._ring.state_dict(),
            "v_r": [t.clone() for t in self._v_r] if self._tuned else None,
            "v_a": [t.clone() for t in self._v_a] if self._tuned else None,
        }

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Ring, and — when λ is tuned — λ, v_r and v_a. A snapshot without v_r/v_a (taken with η_λ = 0)
        restarts them from zeros; with η_λ = 0, λ is the setting λ⁰, whatever the snapshot says."""
        self._ring.load_state_dict(state["ring"], shapes=self._shapes, dtypes=self._dtypes, device=self._device)
        if not self._tuned:
            return
        assert isinstance(self._lam, Tensor)
        self._lam.fill_(float(state["lambda"]))
        for key, dst in (("v_r", self._v_r), ("v_a", self._v_a)):
            src = state[key]
            if src is None:
                for t in dst:
                    t.zero_()
                continue
            got = [tuple(t.shape) for t in src]
            if got != list(self._shapes):
                raise ConfigError(
                    f"{self.name} snapshot {key} shapes {got} do not match the stage's parameters {list(self._shapes)}"
                )
            for d, t in zip(dst, src, strict=True):
                d.copy_(t)
        self._v_a_zero = not any(bool(t.any()) for t in self._v_a)


class IterFisherClosedFormCompensator(IterFisherCompensator):
    """Alg. 1's iteration with λ set every call to the minimiser of eq. lambda-objective-v1,
    λ* = ⟨Δv_r, v_a⟩ / (‖v_a‖² + ν) (denominator floored at 1e-30 when ν = 0). A *different* algorithm
    from Ferret's gradient step (DESIGN §3.3: it swings by orders of magnitude on MNISTNet), offered
    separately. v_r and v_a are always allocated; ``eta_lambda`` is unused; λ starts at λ⁰ only until the
    first call (where v_a = 0 gives λ* = 0)."""

    name = "iter-fisher-cf"

    def _uses_ema(self) -> bool:
        return True

    def _update_lambda(self, cross: Tensor, norm_sq: Tensor) -> None:
        assert isinstance(self._lam, Tensor)
        self._lam.copy_(cross / (norm_sq + self.settings.nu).clamp_min(_TINY))
