"""Fisher-family compensators against hand-written references (paper Alg. 1, DESIGN §3.3, §3.4)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from ferret_core.compensation import CompensatorSettings, StageCompensator, make_compensator
from ferret_core.compensation.fisher import fisher_step
from ferret_core.compensation.iter_fisher import IterFisherCompensator

SHAPES = [(3, 4), (5,)]
F64 = torch.float64


def _rand(gen: torch.Generator, scale: float = 1.0) -> list[Tensor]:
    return [scale * torch.randn(s, generator=gen, dtype=F64) for s in SHAPES]


def _make(name: str, capacity: int = 8, **settings: float) -> StageCompensator:
    params = [torch.zeros(s, dtype=F64) for s in SHAPES]
    return make_compensator(name, params, CompensatorSettings(**settings), capacity)


def _versions(comp: StageCompensator, deltas: Sequence[Sequence[Tensor]]) -> list[list[Tensor]]:
    """Feed ``deltas`` to ``comp`` as master updates from θ^0 = 0; returns θ^0..θ^n."""
    versions = [[torch.zeros(s, dtype=F64) for s in SHAPES]]
    for delta in deltas:
        versions.append([v + d for v, d in zip(versions[-1], delta, strict=True)])
        comp.observe_update(delta)
    return versions


def _one_step(g: Sequence[Tensor], delta: Sequence[Tensor], lam: float) -> list[Tensor]:
    """The paper's A_I, written out: g + λ·g⊙g⊙Δθ."""
    return [gi + lam * gi * gi * di for gi, di in zip(g, delta, strict=True)]


def _close(a: Sequence[Tensor], b: Sequence[Tensor]) -> None:
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-14)


# --- the iteration -------------------------------------------------------------------------------------


def test_iter_fisher_with_one_step_equals_fisher() -> None:
    gen = torch.Generator().manual_seed(0)
    fisher = _make("fisher", fisher_lambda=0.7)
    iterative = _make("iter-fisher", lambda0=0.7, eta_lambda=0.0)
    then = _rand(gen)
    now = [t + d for t, d in zip(then, _rand(gen, 0.3), strict=True)]
    delta = [n - t for n, t in zip(now, then, strict=True)]  # exactly what the engine would observe
    iterative.observe_update(delta)
    grads = _rand(gen)
    a = fisher.compensate(grads, staleness=1, theta_then=then, theta_now=now)
    b = iterative.compensate(grads, staleness=1, theta_then=then, theta_now=now)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    _close(a, _one_step(grads, delta, 0.7))


def test_iter_fisher_with_two_steps_applies_the_formula_twice_oldest_first() -> None:
    gen = torch.Generator().manual_seed(1)
    comp = _make("iter-fisher", lambda0=0.4, eta_lambda=0.0)
    d1, d2 = _rand(gen, 0.5), _rand(gen, 0.5)
    versions = _versions(comp, [_rand(gen), d1, d2])  # the first update predates the gradient
    grads = _rand(gen)
    out = comp.compensate(grads, staleness=2, theta_then=versions[1], theta_now=versions[3])
    g1 = [g + 0.4 * g * g * a for g, a in zip(grads, d1, strict=True)]
    g2 = [g + 0.4 * g * g * b for g, b in zip(g1, d2, strict=True)]
    _close(out, g2)
    via_d2 = [g + 0.4 * g * g * b for g, b in zip(grads, d2, strict=True)]
    swapped = [g + 0.4 * g * g * a for g, a in zip(via_d2, d1, strict=True)]
    assert not all(torch.allclose(o, s) for o, s in zip(out, swapped, strict=True))


def test_iteration_differs_from_one_shot_fisher_over_the_same_gap() -> None:
    gen = torch.Generator().manual_seed(2)
    iterative = _make("iter-fisher", lambda0=0.5, eta_lambda=0.0)
    fisher = _make("fisher", fisher_lambda=0.5)
    versions = _versions(iterative, [_rand(gen) for _ in range(3)])
    grads = _rand(gen)
    a = iterative.compensate(grads, staleness=3, theta_then=versions[0], theta_now=versions[3])
    b = fisher.compensate(grads, staleness=3, theta_then=versions[0], theta_now=versions[3])
    assert not all(torch.allclose(x, y) for x, y in zip(a, b, strict=True))


def test_staleness_beyond_the_ring_uses_the_latest_deltas_and_counts_truncation() -> None:
    gen = torch.Generator().manual_seed(3)
    comp = _make("iter-fisher", capacity=2, lambda0=0.3, eta_lambda=0.0)
    deltas = [_rand(gen, 0.5) for _ in range(5)]
    versions = _versions(comp, deltas)
    grads = _rand(gen)
    out = comp.compensate(grads, staleness=4, theta_then=versions[1], theta_now=versions[5])
    _close(out, _one_step(_one_step(grads, deltas[3], 0.3), deltas[4], 0.3))
    comp.compensate(grads, staleness=2, theta_then=versions[3], theta_now=versions[5])
    comp.compensate(grads, staleness=3, theta_then=versions[2], theta_now=versions[5])
    assert comp.stats()["truncated"] == 2.0
    assert comp.stats()["calls"] == 3.0


def test_ring_of_capacity_zero_never_crashes() -> None:
    comp = _make("iter-fisher", capacity=0)
    versions = _versions(comp, [[torch.ones(s, dtype=F64) for s in SHAPES]])
    grads = [torch.ones(s, dtype=F64) for s in SHAPES]
    out = comp.compensate(grads, staleness=1, theta_then=versions[0], theta_now=versions[1])
    assert all(torch.equal(o, g) for o, g in zip(out, grads, strict=True))
    assert comp.stats()["truncated"] == 1.0


@given(
    tau=st.integers(min_value=0, max_value=6),
    seed=st.integers(min_value=0, max_value=2**16),
    scale=st.floats(min_value=1e-3, max_value=1e2),
)
def test_with_lambda_zero_every_fisher_compensator_is_the_identity(tau: int, seed: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    comps = [
        _make("fisher", fisher_lambda=0.0),
        _make("iter-fisher", capacity=4, lambda0=0.0, eta_lambda=0.0),
        _make("iter-fisher-cf", capacity=4),  # first call: v_a = 0, so λ* = 0
    ]
    deltas = [_rand(gen, scale) for _ in range(tau)]
    grads = _rand(gen, scale)
    for comp in comps:
        versions = _versions(comp, deltas)
        out = comp.compensate(grads, staleness=tau, theta_then=versions[0], theta_now=versions[-1])
        for o, g in zip(out, grads, strict=True):
            assert torch.equal(o, g)


# --- λ -------------------------------------------------------------------------------------------------


def _reference_run(
    calls: Sequence[tuple[int, int]], settings: CompensatorSettings, closed_form: bool, seed: int
) -> tuple[list[list[Tensor]], list[float]]:
    """Alg. 1 with persistent λ, v_r, v_a, written independently in float64 (no ring, no truncation).

    ``calls`` is a list of (updates before the call, τ). Returns the outputs and λ after every call.
    """
    gen = torch.Generator().manual_seed(seed)
    lam, alpha, eta, nu = settings.lambda0, settings.alpha, settings.eta_lambda, settings.nu
    v_r = torch.zeros(sum(torch.Size(s).numel() for s in SHAPES), dtype=F64)
    v_a = torch.zeros_like(v_r)
    history: list[Tensor] = []  # flattened deltas
    outs, lams = [], []
    for updates, tau in calls:
        history += [torch.cat([d.flatten() for d in _rand(gen, 0.2)]) for _ in range(updates)]
        g = torch.cat([x.flatten() for x in _rand(gen)])
        used = history[len(history) - tau :] if tau else []
        if not tau:  # a fresh gradient does not enter Alg. 1: returned as is, λ, v_r, v_a unchanged
            outs.append(list(torch.split(g, [torch.Size(s).numel() for s in SHAPES])))
            lams.append(lam)
            continue
        dv_r = (1 - alpha) * (g - v_r)
        if closed_form:
            lam = float(dv_r @ v_a / (v_a @ v_a + nu))
        else:
            lam = lam - eta * float(-2 * (dv_r - lam * v_a) @ v_a + 2 * nu * lam)
        v_r = alpha * v_r + (1 - alpha) * g
        first = used[0] if used else torch.zeros_like(g)
        v_a = alpha * v_a + (1 - alpha) * g * g * first
        for delta in used:
            g = g + lam * g * g * delta
        outs.append(list(torch.split(g, [torch.Size(s).numel() for s in SHAPES])))
        lams.append(lam)
    return outs, lams


def _engine_run(
    comp: StageCompensator, calls: Sequence[tuple[int, int]], seed: int
) -> tuple[list[list[Tensor]], list[float]]:
    gen = torch.Generator().manual_seed(seed)
    outs, lams = [], []
    theta = [torch.zeros(s, dtype=F64) for s in SHAPES]
    versions = [theta]
    for updates, tau in calls:
        for _ in range(updates):
            delta = _rand(gen, 0.2)
            versions.append([v + d for v, d in zip(versions[-1], delta, strict=True)])
            comp.observe_update(delta)
        grads = _rand(gen)
        out = comp.compensate(grads, staleness=tau, theta_then=versions[-1 - tau], theta_now=versions[-1])
        outs.append([o.flatten() for o in out])
        lams.append(comp.stats()["lambda"])
    return outs, lams


CALLS = [(1, 0), (1, 1), (2, 2), (0, 1), (1, 3), (3, 1), (0, 0), (1, 2)]


@pytest.mark.parametrize("name", ["iter-fisher", "iter-fisher-cf"])
def test_lambda_tuning_matches_an_independent_reference(name: str) -> None:
    settings = CompensatorSettings(lambda0=0.2, eta_lambda=0.05, alpha=0.7, nu=1e-3)
    comp = make_compensator(name, [torch.zeros(s, dtype=F64) for s in SHAPES], settings, 4)
    got, got_lams = _engine_run(comp, CALLS, seed=5)
    want, want_lams = _reference_run(CALLS, settings, closed_form=name == "iter-fisher-cf", seed=5)
    assert got_lams == pytest.approx(want_lams, rel=1e-10, abs=1e-12)
    for g_step, w_step in zip(got, want, strict=True):
        _close(g_step, w_step)
    assert len(set(got_lams)) > 2, "λ must move from call to call"


def test_lambda_moves_when_eta_is_positive_with_a_large_v_a() -> None:
    comp = _make("iter-fisher", lambda0=0.2, eta_lambda=2e-6)
    big = [torch.full(s, 10.0, dtype=F64) for s in SHAPES]
    versions = _versions(comp, [big])
    assert comp.stats()["lambda"] == 0.2
    comp.compensate(big, staleness=1, theta_then=versions[0], theta_now=versions[1])
    # v_a was still 0 when λ stepped (Alg. 1 line 5 precedes line 7): only the ν-term acted
    lam = 0.2 - 2 * 2e-6 * 1e-3 * 0.2
    assert comp.stats()["lambda"] == pytest.approx(lam, rel=1e-14)
    versions = _versions(comp, [big])
    comp.compensate(big, staleness=1, theta_then=versions[0], theta_now=versions[1])
    # now v_a = 0.1·10·10·10 = 100 per element, Δv_r = 0.1·(10 − 1) = 0.9, 17 elements:
    # λ ← λ + 2η·(17·0.9·100 − λ·17·100² − νλ)
    lam = lam + 2 * 2e-6 * (17 * 0.9 * 100 - lam * 17 * 100**2 - 1e-3 * lam)
    assert comp.stats()["lambda"] == pytest.approx(lam, rel=1e-12)
    assert abs(comp.stats()["lambda"] - 0.2) > 1e-3


def test_lambda_stays_exactly_lambda0_when_eta_is_zero() -> None:
    comp = _make("iter-fisher", capacity=3, lambda0=0.2, eta_lambda=0.0)
    _engine_run(comp, CALLS, seed=6)
    assert comp.stats()["lambda"] == 0.2


def test_closed_form_sets_lambda_every_compensated_call() -> None:
    comp = _make("iter-fisher-cf", lambda0=0.2, eta_lambda=0.0)
    _, lams = _engine_run(comp, CALLS[:4], seed=7)
    assert lams[0] == 0.2  # τ = 0: a fresh gradient does not enter Alg. 1, λ is still λ⁰
    assert lams[1] == 0.0  # the first compensated call: v_a = 0 when λ* is set
    assert lams[2] != lams[3]


@pytest.mark.parametrize("name", ["iter-fisher", "iter-fisher-cf", "iter-fisher-lean"])
def test_a_fresh_gradient_is_returned_as_is_and_changes_no_state(name: str) -> None:
    """τ = 0 (nothing stale: a 1-stage × 1-worker plan's every gradient) is the identity and leaves λ, v_r, v_a
    and the ring as they were, after stale calls too (the module docstring's reading)."""
    comp = _make(name, lambda0=0.2, eta_lambda=0.05)
    _engine_run(comp, CALLS[:3], seed=8)
    before = comp.state_dict()
    grads = [torch.full(s, 3.0, dtype=F64) for s in SHAPES]
    theta = [torch.zeros(s, dtype=F64) for s in SHAPES]
    out = comp.compensate(grads, staleness=0, theta_then=theta, theta_now=theta)
    assert all(o is g for o, g in zip(out, grads, strict=True))
    after = comp.state_dict()
    assert after["lambda"] == before["lambda"]
    for key in ("v_r", "v_a"):
        for a, b in zip(after[key], before[key], strict=True):
            assert torch.equal(a, b)


def test_relative_correction_is_reported() -> None:
    comp = _make("iter-fisher", lambda0=0.5, eta_lambda=0.0)
    ones = [torch.ones(s, dtype=F64) for s in SHAPES]
    versions = _versions(comp, [[torch.full(s, 0.1, dtype=F64) for s in SHAPES]] * 2)
    comp.compensate(ones, staleness=1, theta_then=versions[1], theta_now=versions[2])
    # g_1 = 1 + 0.5·1·1·0.1 = 1.05 everywhere: relative correction 0.05
    assert comp.stats()["relative_correction_mean"] == pytest.approx(0.05)
    comp.compensate(ones, staleness=0, theta_then=versions[2], theta_now=versions[2])
    assert comp.stats()["relative_correction_mean"] == pytest.approx(0.05)  # τ = 0 calls not averaged


# --- memory --------------------------------------------------------------------------------------------


def _ptrs(tensors: Sequence[Tensor]) -> set[int]:
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_state_tensors_hold_the_ring_and_the_emas() -> None:
    gen = torch.Generator().manual_seed(8)
    tuned = _make("iter-fisher", capacity=3, eta_lambda=1e-3)
    fixed = _make("iter-fisher", capacity=3, eta_lambda=0.0)
    closed = _make("iter-fisher-cf", capacity=3, eta_lambda=0.0)
    for comp in (tuned, fixed, closed):
        versions = _versions(comp, [_rand(gen) for _ in range(5)])
        comp.compensate(_rand(gen), staleness=2, theta_then=versions[3], theta_now=versions[5])
    for comp, emas in ((tuned, 2), (fixed, 0), (closed, 2)):
        ring = comp.ring.state_tensors()  # type: ignore[attr-defined]
        assert len(ring) == 3 * len(SHAPES)
        held = comp.state_tensors()
        assert _ptrs(ring) <= _ptrs(held)
        per_parameter = [t for t in held if t.dim() > 0]
        assert len(per_parameter) == len(ring) + emas * len(SHAPES)
        assert all(t.dim() == 0 for t in held if t.dim() == 0)  # the rest: λ and the statistics
        assert sum(t.numel() for t in held if t.dim() == 0) <= 2


def test_fixed_lambda_allocates_no_emas_before_any_call() -> None:
    fixed = _make("iter-fisher", capacity=2, eta_lambda=0.0)
    assert fixed.state_tensors() == []
    tuned = _make("iter-fisher", capacity=2, eta_lambda=1e-3)
    assert sum(t.numel() for t in tuned.state_tensors()) == 2 * 17 + 1  # v_r, v_a and λ


# --- GPU tier: same numbers on CUDA, and no host synchronisation in the hot path -----------------------


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "name", ["none", "step-aware", "gap-aware", "fisher", "iter-fisher", "iter-fisher-cf", "iter-fisher-lean"]
)
def test_cuda_matches_cpu_without_host_sync(name: str) -> None:
    settings = CompensatorSettings(eta_lambda=1e-2)
    results = {}
    for device in ("cpu", "cuda"):
        params = [torch.zeros(s, dtype=torch.float32, device=device) for s in SHAPES]
        comp = make_compensator(name, params, settings, 2)
        gen = torch.Generator().manual_seed(9)
        taus = (0, 1, 2, 3, 1)
        # everything the run needs is on the device before the sync check starts (H2D copies sync)
        deltas = [[0.1 * torch.randn(s, generator=gen).to(device) for s in SHAPES] for _ in taus]
        grads = [[torch.randn(s, generator=gen).to(device) for s in SHAPES] for _ in taus]
        versions = [params]
        for delta in deltas:
            versions.append([v + d for v, d in zip(versions[-1], delta, strict=True)])
        outs = []
        if device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            for step, tau in enumerate(taus):
                comp.observe_update(deltas[step])
                now = versions[step + 1]
                then = versions[max(0, step + 1 - tau)]
                outs.append(comp.compensate(grads[step], staleness=tau, theta_then=then, theta_now=now))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        results[device] = (outs, comp.stats())
    for cpu_step, gpu_step in zip(results["cpu"][0], results["cuda"][0], strict=True):
        for c, g in zip(cpu_step, gpu_step, strict=True):
            torch.testing.assert_close(g.cpu(), c, rtol=1e-5, atol=1e-6)
    assert results["cuda"][1] == pytest.approx(results["cpu"][1], rel=1e-4, nan_ok=True)


class _AsFirstWritten(IterFisherCompensator):
    """Alg. 1 as first written (before g⊙Δ_1 was shared between λ's EMA and the first step): line 7 and
    line 9 each multiply g by Δ_1."""

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        if staleness == 0:
            return grads
        deltas = self._ring.recent(staleness)
        if len(deltas) < staleness:
            self._truncated += 1
            self._ring.grow(min(staleness, self._ring.limit))
        if self._tuned:
            self._tune(grads, deltas[0] if deltas else None)
        if not deltas:
            return grads
        out = fisher_step(grads, deltas[0], self._lam)
        for delta in deltas[1:]:
            out = fisher_step(out, delta, self._lam, inplace=True)
        return out


@pytest.mark.parametrize("eta_lambda", [0.0, 2e-6, 1e-2])
def test_sharing_g_times_the_first_delta_changes_no_bit(eta_lambda: float) -> None:
    """float32 stages large enough for the vectorised kernels: the same outputs, λ, v_r and v_a, bit for bit,
    over updates and τ = 0–3 gradients (τ = 3 beyond a ring of 2: truncated)."""
    s = CompensatorSettings(eta_lambda=eta_lambda)
    gen = torch.Generator().manual_seed(9)

    def tensors(scale: float) -> list[Tensor]:
        return [scale * torch.randn(shape, generator=gen) for shape in ((300, 97), (97,))]

    params = tensors(1.0)
    shared, written = make_compensator("iter-fisher", params, s, 2), _AsFirstWritten(params, s, 2)
    for tau in (1, 0, 2, 1, 3, 2, 1):
        delta = tensors(1e-2)
        shared.observe_update(delta)
        written.observe_update(delta)
        grads = tensors(1e-1)
        then, now = tensors(1.0), tensors(1.0)
        kwargs = {"staleness": tau, "theta_then": then, "theta_now": now}
        got, want = shared.compensate(grads, **kwargs), written.compensate(grads, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        a, b = shared.state_dict(), written.state_dict()
        assert a["lambda"] == b["lambda"]
        for key in ("v_r", "v_a"):
            assert (a[key] is None) == (b[key] is None)
            if a[key] is not None:
                assert all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True))
    assert shared.truncated == written.truncated == 1
