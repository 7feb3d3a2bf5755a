"""``iter-fisher-lean``: Alg. 1 in one step from the stash.

Its difference from the iterated form is second order in λ·g⊙g⊙Δθ: scaling every delta by s scales the
first-order correction by s and the difference by s².
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor
from torch.testing import assert_close

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.compensation.base import StageCompensator
from ferret_core.compensation.fisher import fisher_step
from ferret_core.compensation.lean import IterFisherLeanCompensator

SHAPES = [(6, 5), (7,)]


def _tensors(seed: int, scale: float = 1.0) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [scale * torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]


def _pair(settings: CompensatorSettings, tau: int) -> tuple[StageCompensator, StageCompensator]:
    params = _tensors(0)
    iterated = make_compensator("iter-fisher", params, settings, tau)
    return iterated, make_compensator("iter-fisher-lean", params, settings, tau)


def _versions(tau: int, step: float, seed: int) -> list[list[Tensor]]:
    versions = [_tensors(seed)]
    for k in range(tau):
        versions.append([v + d for v, d in zip(versions[-1], _tensors(seed + 10 + k, step), strict=True)])
    return versions


def _both(
    tau: int, step: float, seed: int, settings: CompensatorSettings
) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """(g, iterated, lean) for one gradient τ updates stale, the deltas of size ~``step``."""
    iterated, lean = _pair(settings, tau)
    versions = _versions(tau, step, seed)
    for old, new in itertools.pairwise(versions):
        iterated.observe_update([n - o for n, o in zip(new, old, strict=True)])
    grads = _tensors(seed + 1)
    kwargs = {"staleness": tau, "theta_then": versions[0], "theta_now": versions[-1]}
    return grads, iterated.compensate(grads, **kwargs), lean.compensate(grads, **kwargs)


def _norm(ts: list[Tensor]) -> float:
    return float(torch.sqrt(sum((t * t).sum() for t in ts)))  # type: ignore[arg-type]


def test_zero_staleness_is_the_identity_and_holds_no_ring() -> None:
    _, lean = _pair(CompensatorSettings(), 0)
    grads = _tensors(3)
    out = lean.compensate(grads, staleness=0, theta_then=_tensors(4), theta_now=_tensors(5))
    assert all(o is g for o, g in zip(out, grads, strict=True))
    assert lean.needs_deltas is False
    fixed = make_compensator("iter-fisher-lean", _tensors(0), CompensatorSettings(eta_lambda=0.0), 9)
    assert fixed.state_tensors() == []  # η_λ = 0: no per-parameter state at all (the paper's manual-λ mode)


def test_one_step_equals_iter_fisher_exactly_lambda_tuning_included() -> None:
    settings = CompensatorSettings(eta_lambda=1e-2)
    iterated, lean = _pair(settings, 1)
    versions = _versions(12, 0.1, seed=7)
    for k in range(1, len(versions)):
        old, new = versions[k - 1], versions[k]
        iterated.observe_update([n - o for n, o in zip(new, old, strict=True)])
        grads = _tensors(100 + k)
        kwargs = {"staleness": 1, "theta_then": old, "theta_now": new}
        assert_close(lean.compensate(grads, **kwargs), iterated.compensate(grads, **kwargs), rtol=1e-12, atol=1e-15)
    assert lean.stats()["lambda"] == pytest.approx(iterated.stats()["lambda"], rel=1e-12)
    assert lean.stats()["lambda"] != settings.lambda0  # λ really moved, identically in both


@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(0, 1000))
def test_the_difference_from_the_iteration_is_second_order(tau: int, seed: int) -> None:
    fixed = CompensatorSettings(eta_lambda=0.0, lambda0=0.2)
    rows = []
    for step in (0.01, 0.005, 0.0025):
        g, iterated, lean = _both(tau, step, seed, fixed)
        first_order = _norm([i - x for i, x in zip(iterated, g, strict=True)])
        difference = _norm([i - x for i, x in zip(iterated, lean, strict=True)])
        rows.append((first_order, difference))
    (c1, d1), (c2, d2), (c3, d3) = rows
    assert c1 / c2 == pytest.approx(2.0, rel=0.1) and c2 / c3 == pytest.approx(2.0, rel=0.1)  # first order
    assert d1 / d2 == pytest.approx(4.0, rel=0.15) and d2 / d3 == pytest.approx(4.0, rel=0.15)  # second order
    assert d3 < 0.1 * c3


def test_lean_state_is_the_moments_only() -> None:
    iterated, lean = _pair(CompensatorSettings(), 5)
    versions = _versions(5, 0.1, seed=1)
    for old, new in itertools.pairwise(versions):
        iterated.observe_update([n - o for n, o in zip(new, old, strict=True)])
        lean.observe_update([n - o for n, o in zip(new, old, strict=True)])
    size = sum(t.numel() for t in _tensors(0))

    def held(c: StageCompensator) -> int:
        return sum(t.numel() for t in c.state_tensors() if t.dim() > 0)

    assert held(lean) == 2 * size  # v_r, v_a
    assert held(iterated) == 2 * size + 5 * size  # v_r, v_a and a ring of five deltas


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 2), min_size=1, max_size=8), st.sampled_from(["iter-fisher", "iter-fisher-lean"]))
def test_skipping_the_sums_while_v_a_is_zero_changes_no_state(stalenesses: list[int], name: str) -> None:
    """While v_a is exactly 0 (only τ = 0 gradients so far) ``_tune`` skips ⟨Δv_r, v_a⟩, ‖v_a‖² and α·v_a;
    λ, v_r, v_a and the compensated gradients equal those of a compensator that always computes them."""
    s = CompensatorSettings(eta_lambda=0.05)
    params = _tensors(0)
    fast = make_compensator(name, params, s, 4)
    full = make_compensator(name, params, s, 4)
    for k, tau in enumerate(stalenesses):
        full._v_a_zero = False  # type: ignore[attr-defined]
        versions = _versions(tau, 0.1, 20 + k)
        for comp in (fast, full):
            for old, new in itertools.pairwise(versions):
                comp.observe_update([n - o for n, o in zip(new, old, strict=True)])
        grads = _tensors(40 + k)
        kwargs = {"staleness": tau, "theta_then": versions[0], "theta_now": versions[-1]}
        assert_close(fast.compensate(grads, **kwargs), full.compensate(grads, **kwargs), rtol=0, atol=0)
        assert fast.state_dict()["lambda"] == full.state_dict()["lambda"]
        for key in ("v_r", "v_a"):
            assert_close(fast.state_dict()[key], full.state_dict()[key], rtol=0, atol=0)


class _OneStepWrittenOut(IterFisherLeanCompensator):
    """The lean form as first written (before g⊙Δ was shared between λ's EMA and the step at τ = 1): the gap,
    Alg. 1 lines 3–7 from it, then eq. gt-taylor-expansion-approximation over it."""

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        if staleness == 0:
            return grads
        gap = list(torch._foreach_sub(list(theta_now), list(theta_then)))
        if self._tuned:
            self._tune(grads, list(torch._foreach_div(gap, float(staleness))) if staleness > 1 else gap)
        return fisher_step(grads, gap, self._lam)


@pytest.mark.parametrize("eta_lambda", [0.0, 2e-6, 1e-2])
def test_sharing_g_times_delta_at_staleness_one_changes_no_bit(eta_lambda: float) -> None:
    """float32 stages large enough for the vectorised kernels (a 300 × 97 weight): the same outputs, λ, v_r and
    v_a, bit for bit, over a run of τ = 1, 2 and 0 gradients."""
    s = CompensatorSettings(eta_lambda=eta_lambda)
    gen = torch.Generator().manual_seed(5)

    def tensors(scale: float) -> list[Tensor]:
        return [scale * torch.randn(shape, generator=gen) for shape in ((300, 97), (97,))]

    params = tensors(1.0)
    fast = make_compensator("iter-fisher-lean", params, s, 2)
    written = _OneStepWrittenOut(params, s, 2)
    for tau in (1, 1, 2, 0, 1, 1, 2, 1):
        then = tensors(1.0)
        now = [t + d for t, d in zip(then, tensors(1e-2), strict=True)]
        grads = tensors(1e-1)
        kwargs = {"staleness": tau, "theta_then": then, "theta_now": now}
        got, want = fast.compensate(grads, **kwargs), written.compensate(grads, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        a, b = fast.state_dict(), written.state_dict()
        assert a["lambda"] == b["lambda"]
        for key in ("v_r", "v_a"):
            assert (a[key] is None) == (b[key] is None)
            if a[key] is not None:
                assert all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True))
