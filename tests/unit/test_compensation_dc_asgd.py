"""DC-ASGD-a (``dc-asgd-a``) against a hand computation, and compensator state only where a stage can be stale."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from ferret_core.compensation import COMPENSATOR_NAMES, CompensatorSettings, make_compensator
from ferret_core.compensation.dc_asgd import DcAsgdAdaptiveCompensator
from ferret_core.errors import ConfigError

F64 = torch.float64


def _t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=F64)


def test_correction_matches_a_hand_computation() -> None:
    s = CompensatorSettings(dc_lambda0=2.0, dc_momentum=0.5, dc_eps=1e-12)
    comp = make_compensator("dc-asgd-a", [_t(0.0, 0.0)], s, 3)
    # first gradient, fresh: MeanSquare = 0.5·0 + 0.5·g² = (0.5, 2); returned as is
    out = comp.compensate([_t(1.0, -2.0)], staleness=0, theta_then=[_t(0, 0)], theta_now=[_t(0, 0)])
    torch.testing.assert_close(out[0], _t(1.0, -2.0), rtol=0, atol=0)
    # second gradient g = (2, 1), τ = 2, Δθ = (0.1, −0.3):
    # MeanSquare = 0.5·(0.5, 2) + 0.5·(4, 1) = (2.25, 1.5); bias 1 − 0.5² = 0.75 → (3, 2)
    # g + 2·g⊙g⊙Δθ/√(3, 2) = (2 + 2·4·0.1/√3, 1 + 2·1·(−0.3)/√2)
    g = _t(2.0, 1.0)
    out = comp.compensate([g], staleness=2, theta_then=[_t(1.0, 1.0)], theta_now=[_t(1.1, 0.7)])
    want = _t(2.0 + 2 * 4 * 0.1 / math.sqrt(3.0), 1.0 + 2 * 1 * -0.3 / math.sqrt(2.0))
    torch.testing.assert_close(out[0], want, rtol=1e-12, atol=1e-12)
    rel = float(torch.linalg.vector_norm(want - g) / torch.linalg.vector_norm(g))
    assert comp.stats()["relative_correction_mean"] == pytest.approx(rel, rel=1e-9)
    assert comp.stats()["lambda"] == 2.0


@given(
    values=st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=6),
    fresh=st.integers(0, 4),
)
@settings(max_examples=50, deadline=None)
def test_zero_staleness_is_the_identity_whatever_came_before(values: list[float], fresh: int) -> None:
    comp = make_compensator("dc-asgd-a", [torch.zeros(len(values), dtype=F64)], CompensatorSettings(), 2)
    g = torch.tensor(values, dtype=F64)
    for _ in range(fresh):
        comp.compensate([g * 0.5], staleness=1, theta_then=[g], theta_now=[g + 1])
    out = comp.compensate([g], staleness=0, theta_then=[g], theta_now=[g + 1])
    assert out[0] is g


def test_the_correction_scales_like_lambda0_times_the_step() -> None:
    """MeanSquare cancels the gradient's scale: scaling g by 1000 leaves ‖c‖/‖g‖ unchanged."""
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(50, generator=gen, dtype=F64)
    gap = 1e-2 * torch.randn(50, generator=gen, dtype=F64)
    rels = []
    for scale in (1e-3, 1.0):
        comp = make_compensator("dc-asgd-a", [torch.zeros(50, dtype=F64)], CompensatorSettings(), 1)
        comp.compensate([g * scale], staleness=1, theta_then=[torch.zeros(50, dtype=F64)], theta_now=[gap])
        rels.append(comp.stats()["relative_correction_mean"])
    assert rels[0] == pytest.approx(rels[1], rel=1e-5)  # up to ε under the root
    assert rels[0] > 1e-3  # acts: λ₀ = 2 on a 1 % step is ~2 % of the gradient


def test_snapshot_round_trip() -> None:
    comp = make_compensator("dc-asgd-a", [torch.zeros(3, dtype=F64)], CompensatorSettings(), 2)
    g = _t(1.0, 2.0, 3.0)
    comp.compensate([g], staleness=1, theta_then=[g], theta_now=[g * 2])
    again = make_compensator("dc-asgd-a", [torch.zeros(3, dtype=F64)], CompensatorSettings(), 2)
    again.load_state_dict(comp.state_dict())
    args = {"staleness": 2, "theta_then": [g], "theta_now": [g * 3]}
    torch.testing.assert_close(again.compensate([g], **args)[0], comp.compensate([g], **args)[0])


def test_the_bound_clips_each_element_to_kappa_times_its_gradient() -> None:
    """g = (2, 1), τ = 1, Δθ = (1, −1), λ₀ = 10, m = 0.5 (one gradient seen: bias-corrected MeanSquare = g²):
    unbounded corrections 10·g²·Δθ/|g| = (20, −10) become (2, −1) under κ = 1, (1, −0.5) under κ = 0.5."""
    g = _t(2.0, 1.0)
    args = {"staleness": 1, "theta_then": [_t(0.0, 0.0)], "theta_now": [_t(1.0, -1.0)]}
    outs = {}
    for bound in (math.inf, 1.0, 0.5):
        s = CompensatorSettings(dc_lambda0=10.0, dc_momentum=0.5, dc_bound=bound)
        outs[bound] = make_compensator("dc-asgd-a", [_t(0.0, 0.0)], s, 1).compensate([g], **args)[0]
    torch.testing.assert_close(outs[math.inf], _t(22.0, -9.0), rtol=1e-9, atol=1e-9)  # the paper's form
    torch.testing.assert_close(outs[1.0], _t(4.0, 0.0), rtol=1e-9, atol=1e-9)  # doubled, cancelled
    torch.testing.assert_close(outs[0.5], _t(3.0, 0.5), rtol=1e-9, atol=1e-9)


@given(
    pairs=st.lists(st.tuples(st.floats(-10, 10), st.floats(-1, 1)), min_size=1, max_size=8),
    bound=st.sampled_from([0.25, 1.0, 3.0]),
    lambda0=st.sampled_from([0.5, 10.0, 1e4]),
)
@settings(max_examples=60, deadline=None)
def test_bounded_corrections_stay_within_kappa_and_equal_the_papers_where_it_does_not_bind(
    pairs: list[tuple[float, float]], bound: float, lambda0: float
) -> None:
    g = torch.tensor([p[0] for p in pairs], dtype=F64)
    gap = torch.tensor([p[1] for p in pairs], dtype=F64)
    zeros = torch.zeros(len(pairs), dtype=F64)
    out = {}
    for kappa in (bound, math.inf):
        comp = make_compensator("dc-asgd-a", [zeros], CompensatorSettings(dc_lambda0=lambda0, dc_bound=kappa), 1)
        comp.compensate([g * 0.5], staleness=1, theta_then=[zeros], theta_now=[gap])  # a MeanSquare to start from
        out[kappa] = comp.compensate([g], staleness=1, theta_then=[zeros], theta_now=[gap])[0]
    correction, unbounded = out[bound] - g, out[math.inf] - g
    assert bool(torch.all(correction.abs() <= bound * g.abs() * (1 + 1e-12) + 1e-12))
    inside = unbounded.abs() <= bound * g.abs()
    torch.testing.assert_close(correction[inside], unbounded[inside], rtol=1e-12, atol=1e-12)
    # where it binds, the correction keeps the unbounded one's sign
    assert bool(torch.all(correction[~inside] * unbounded[~inside] >= 0))


@pytest.mark.parametrize(
    "bad",
    [
        {"dc_lambda0": -1.0},
        {"dc_momentum": 1.0},
        {"dc_eps": 0.0},
        {"dc_bound": 0.0},
        {"dc_bound": -1.0},
        {"dc_bound": math.nan},
        {"dc_bound": True},
    ],
)
def test_settings_reject_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        CompensatorSettings(**bad)


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_a_stage_that_is_never_stale_holds_no_compensator_state(name: str) -> None:
    """Bound 0 (``ring_capacity`` 0): no per-parameter tensor is allocated, and a stale gradient that
    arrives anyway is applied as is, counted as cut short."""
    settings = CompensatorSettings(eta_lambda=1e-3)
    comp = make_compensator(name, [torch.zeros(4, 3), torch.zeros(3)], settings, 0)
    for _ in range(3):
        comp.observe_update([torch.ones(4, 3), torch.ones(3)])
    g = [torch.ones(4, 3), torch.ones(3)]
    assert all(o is x for o, x in zip(comp.compensate(g, staleness=0, theta_then=g, theta_now=g), g, strict=True))
    assert sum(t.numel() for t in comp.state_tensors()) == 0
    if name in ("none", "step-aware", "fisher", "iter-fisher-lean"):
        return  # they need no state to act on a stale gradient (the lean one with λ = λ⁰)
    out = comp.compensate(g, staleness=2, theta_then=g, theta_now=[t + 1 for t in g])
    assert all(o is x for o, x in zip(out, g, strict=True))
    assert comp.truncated == 1
    assert sum(t.numel() for t in comp.state_tensors()) == 0


@pytest.mark.parametrize("name", ["gap-aware", "iter-fisher", "iter-fisher-cf", "iter-fisher-lean", "dc-asgd-a"])
def test_a_stage_that_can_be_stale_holds_its_moments(name: str) -> None:
    comp = make_compensator(name, [torch.zeros(4, 3)], CompensatorSettings(eta_lambda=1e-3), 1)
    assert sum(t.numel() for t in comp.state_tensors()) >= 12


class _BoundAsFirstWritten(DcAsgdAdaptiveCompensator):
    """The bounded correction as first written: κ|g| always scaled, then minimum, negation and maximum."""

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        s = self.settings
        torch._foreach_mul_(self._mean_square, s.dc_momentum)
        torch._foreach_addcmul_(self._mean_square, grads, grads, value=1.0 - s.dc_momentum)
        self._seen += 1
        if staleness == 0:
            return grads
        root = list(torch._foreach_div(self._mean_square, 1.0 - s.dc_momentum**self._seen))
        torch._foreach_add_(root, s.dc_eps)
        torch._foreach_sqrt_(root)
        term = list(torch._foreach_sub(list(theta_now), list(theta_then)))
        torch._foreach_mul_(term, grads)
        torch._foreach_mul_(term, grads)
        torch._foreach_div_(term, root)
        torch._foreach_mul_(term, s.dc_lambda0)
        limit = list(torch._foreach_abs(grads))
        torch._foreach_mul_(limit, s.dc_bound)
        torch._foreach_minimum_(term, limit)
        torch._foreach_neg_(limit)
        torch._foreach_maximum_(term, limit)
        return list(torch._foreach_add(grads, term))


@pytest.mark.parametrize("bound", [1.0, 0.5, 3.0])
def test_the_bound_in_one_clamp_changes_no_bit(bound: float) -> None:
    """float32 stages large enough for the vectorised kernels, λ₀ large enough that the bound binds often: the
    same outputs and mean squares, bit for bit, as the bound written as minimum, negation and maximum."""
    s = CompensatorSettings(dc_lambda0=2000.0, dc_bound=bound)
    gen = torch.Generator().manual_seed(3)

    def tensors(scale: float) -> list[Tensor]:
        return [scale * torch.randn(shape, generator=gen) for shape in ((300, 97), (97,))]

    params = tensors(1.0)
    now_form, written = make_compensator("dc-asgd-a", params, s, 2), _BoundAsFirstWritten(params, s, 2)
    bound_bites = 0
    for tau in (1, 0, 2, 1, 1, 3):
        then = tensors(1.0)
        now = [t + d for t, d in zip(then, tensors(1e-2), strict=True)]
        grads = tensors(1e-1)
        kwargs = {"staleness": tau, "theta_then": then, "theta_now": now}
        got, want = now_form.compensate(grads, **kwargs), written.compensate(grads, **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        bound_bites += sum(
            int(((a - g).abs() >= bound * g.abs() * (1 - 1e-6)).sum()) for a, g in zip(got, grads, strict=True)
        )
        a, b = now_form.state_dict()["mean_square"], written.state_dict()["mean_square"]
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert bound_bites > 1000  # the bound was exercised, not only the unclipped path
