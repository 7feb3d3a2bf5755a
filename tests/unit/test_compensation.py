"""Compensator contract, registry, ring and the penalty compensators.

The iterative Fisher compensators have their own file, ``test_compensation_iter_fisher.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch
from torch import Tensor

from ferret_core.compensation import (
    COMPENSATOR_NAMES,
    CompensatorSettings,
    DeltaRing,
    StageCompensator,
    make_compensator,
)
from ferret_core.errors import ConfigError, FerretError

SHAPES = [(3, 4), (5,)]


def _params(seed: int = 0, dtype: torch.dtype = torch.float64) -> list[Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=dtype) for s in SHAPES]


def _drive(comp: StageCompensator, steps: int, seed: int = 1) -> list[list[Tensor]]:
    """Observe ``steps`` random master updates; returns the master versions θ^0..θ^steps."""
    gen = torch.Generator().manual_seed(seed)
    versions = [_params(seed + 100)]
    for _ in range(steps):
        delta = [0.1 * torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        versions.append([p + d for p, d in zip(versions[-1], delta, strict=True)])
        comp.observe_update([new - old for new, old in zip(versions[-1], versions[-2], strict=True)])
    return versions


def _make(name: str, capacity: int = 4, **settings: float) -> StageCompensator:
    return make_compensator(name, _params(), CompensatorSettings(**settings), capacity)


# --- settings and registry --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"eta_lambda": -1e-6},
        {"alpha": 1.0},
        {"alpha": -0.1},
        {"nu": -1.0},
        {"gap_eps": 0.0},
        {"lambda0": math.nan},
        {"fisher_lambda": math.inf},
    ],
)
def test_settings_reject_bad_values(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        CompensatorSettings(**bad)


def test_settings_defaults_are_the_papers() -> None:
    s = CompensatorSettings()
    assert (s.lambda0, s.eta_lambda, s.alpha, s.nu, s.fisher_lambda) == (0.2, 2e-6, 0.9, 1e-3, 0.2)


def test_registry_builds_every_name() -> None:
    assert COMPENSATOR_NAMES == (
        "none", "step-aware", "gap-aware", "fisher", "iter-fisher", "iter-fisher-cf", "iter-fisher-lean", "dc-asgd-a"
    )
    for name in COMPENSATOR_NAMES:
        comp = _make(name)
        assert isinstance(comp, StageCompensator)
        assert comp.name == name
        assert (comp.__class__.__doc__ or "").strip(), f"{name} must name the paper it follows"


def test_registry_rejects_unknown_names_and_bad_capacity() -> None:
    with pytest.raises(ConfigError, match="iter-fisher-cf") as info:
        _make("dc-asgd")
    assert isinstance(info.value, ValueError) and isinstance(info.value, FerretError)
    with pytest.raises(ConfigError, match="ring_capacity"):
        _make("iter-fisher", capacity=-1)


def test_misaligned_inputs_and_negative_staleness_raise() -> None:
    comp = _make("fisher")
    p = _params()
    with pytest.raises(ConfigError, match="align"):
        comp.compensate(p[:1], staleness=1, theta_then=p, theta_now=p)
    with pytest.raises(ConfigError, match="staleness"):
        comp.compensate(p, staleness=-1, theta_then=p, theta_now=p)
    with pytest.raises(ConfigError, match="align"):
        comp.observe_update([torch.zeros(2)])


# --- the contract every compensator keeps ------------------------------------------------------------


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_zero_staleness_is_the_identity(name: str) -> None:
    comp = _make(name, lambda0=0.5, fisher_lambda=0.5, eta_lambda=1e-2)
    versions = _drive(comp, 3)
    grads = _params(seed=7)
    for _ in range(3):  # repeated calls too: λ and the EMAs move, the τ = 0 output must not
        out = comp.compensate(grads, staleness=0, theta_then=versions[-1], theta_now=versions[-1])
        assert len(out) == len(grads)
        for o, g in zip(out, grads, strict=True):
            assert torch.equal(o, g)
    assert comp.stats()["relative_correction_mean"] == 0.0


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_inputs_are_never_mutated(name: str) -> None:
    comp = _make(name, eta_lambda=1e-2)
    versions = _drive(comp, 3)
    grads = _params(seed=7)
    copies = [[t.clone() for t in ts] for ts in (grads, versions[0], versions[-1])]
    out = comp.compensate(grads, staleness=3, theta_then=versions[0], theta_now=versions[-1])
    for before, after in zip(copies, (grads, versions[0], versions[-1]), strict=True):
        assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
    assert [tuple(o.shape) for o in out] == SHAPES
    assert all(o.dtype == torch.float64 for o in out)


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_parameters_that_require_grad_build_no_graph(name: str) -> None:
    params = [p.requires_grad_() for p in _params()]
    comp = make_compensator(name, params, CompensatorSettings(eta_lambda=1e-3), 2)
    comp.observe_update([torch.full_like(p, 0.1) for p in params])
    now = [(p + 0.1).detach().requires_grad_() for p in params]
    out = comp.compensate(_params(seed=3), staleness=1, theta_then=params, theta_now=now)
    assert not any(o.requires_grad for o in out)


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_a_stage_without_parameters_works(name: str) -> None:
    comp = make_compensator(name, [], CompensatorSettings(), 3)
    comp.observe_update([])
    assert comp.compensate([], staleness=2, theta_then=[], theta_now=[]) == []
    assert comp.stats()["calls"] == 1.0


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_stats_have_the_required_keys(name: str) -> None:
    comp = _make(name)
    versions = _drive(comp, 2)
    for tau, seed in ((2, 5), (2, 6), (0, 5)):  # two compensated calls: iter-fisher-cf's first λ* is 0
        comp.compensate(
            _params(seed=seed), staleness=tau, theta_then=versions[-1 - tau], theta_now=versions[-1]
        )
    stats = comp.stats()
    assert {"lambda", "relative_correction_mean", "calls", "truncated", "compensated"} <= set(stats)
    assert stats["calls"] == 3.0 and stats["compensated"] == 2.0 and stats["truncated"] == 0.0
    assert all(isinstance(v, float) for v in stats.values())
    if name in ("none", "step-aware", "gap-aware"):
        assert math.isnan(stats["lambda"])
    else:
        assert math.isfinite(stats["lambda"])
    if name == "none":
        assert stats["relative_correction_mean"] == 0.0
    else:
        assert stats["relative_correction_mean"] > 0.0


def _run_sequence(comp: StageCompensator, seed: int) -> list[list[Tensor]]:
    """A fixed interleaving of updates and compensations; returns the compensated gradients."""
    gen = torch.Generator().manual_seed(seed)
    theta = _params(seed)
    history = [theta]
    outs = []
    for step in range(6):
        delta = [0.05 * torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        history.append([t + d for t, d in zip(history[-1], delta, strict=True)])
        comp.observe_update([n - o for n, o in zip(history[-1], history[-2], strict=True)])
        tau = step % 4
        grads = [torch.randn(s, generator=gen, dtype=torch.float64) for s in SHAPES]
        outs.append(
            comp.compensate(grads, staleness=tau, theta_then=history[-1 - tau], theta_now=history[-1])
        )
    return outs


@pytest.mark.parametrize("name", COMPENSATOR_NAMES)
def test_state_dict_round_trip_reproduces_later_outputs(name: str) -> None:
    settings = {"eta_lambda": 1e-2, "lambda0": 0.3}
    original = _make(name, capacity=2, **settings)  # τ up to 3: truncation and a wrapped ring too
    _run_sequence(original, seed=11)
    snapshot = original.state_dict()
    if name in ("iter-fisher", "iter-fisher-cf"):  # the ring's compensators (the lean one has none)
        assert original.stats()["truncated"] > 0
    restored = _make(name, capacity=2, **settings)
    restored.load_state_dict(snapshot)
    assert restored.stats() == pytest.approx(original.stats(), nan_ok=True)
    expected = _run_sequence(original, seed=12)
    got = _run_sequence(restored, seed=12)
    for e_step, g_step in zip(expected, got, strict=True):
        for e, g in zip(e_step, g_step, strict=True):
            assert torch.equal(e, g)
    assert restored.stats() == pytest.approx(original.stats(), nan_ok=True)
    # the snapshot is a copy: the run that continued did not change it
    again = _make(name, capacity=2, **settings)
    again.load_state_dict(snapshot)
    for e, g in zip(_run_sequence(again, seed=12)[-1], expected[-1], strict=True):
        assert torch.equal(e, g)


def test_load_state_dict_rejects_another_compensator_or_ring() -> None:
    with pytest.raises(ConfigError, match="fisher"):
        _make("iter-fisher").load_state_dict(_make("fisher").state_dict())
    with pytest.raises(ConfigError, match="capacity"):
        _make("iter-fisher", capacity=2).load_state_dict(_make("iter-fisher", capacity=3).state_dict())
    with pytest.raises(ConfigError, match="lacks"):
        _make("none").load_state_dict({"name": "none"})


# --- the delta ring -----------------------------------------------------------------------------------


def _delta(value: float) -> list[Tensor]:
    return [torch.full(s, value) for s in SHAPES]


def _values(deltas: Sequence[Sequence[Tensor]]) -> list[float]:
    return [float(d[0].flatten()[0]) for d in deltas]


def test_ring_keeps_only_the_last_capacity_deltas_oldest_first() -> None:
    ring = DeltaRing(3)
    for v in range(1, 6):
        ring.push(_delta(float(v)))
        assert len(ring) == min(v, 3)
    assert ring.pushed == 5
    assert _values(ring.recent(3)) == [3.0, 4.0, 5.0]
    assert _values(ring.recent(2)) == [4.0, 5.0]
    assert _values(ring.recent(10)) == [3.0, 4.0, 5.0]
    assert ring.recent(0) == []
    assert len(ring.state_tensors()) == 3 * len(SHAPES)


def test_ring_copies_what_it_is_given_and_reuses_its_slots() -> None:
    ring = DeltaRing(2)
    given = _delta(1.0)
    ring.push(given)
    given[0].fill_(9.0)
    assert _values(ring.recent(1)) == [1.0]
    ring.push(_delta(2.0))
    storages = {t.untyped_storage().data_ptr() for t in ring.state_tensors()}
    ring.push(_delta(3.0))
    assert {t.untyped_storage().data_ptr() for t in ring.state_tensors()} == storages
    assert _values(ring.recent(2)) == [2.0, 3.0]


def test_ring_of_capacity_zero_holds_nothing() -> None:
    ring = DeltaRing(0)
    ring.push(_delta(1.0))
    assert len(ring) == 0 and ring.recent(1) == [] and ring.state_tensors() == []
    with pytest.raises(ConfigError):
        DeltaRing(-1)


def test_ring_state_dict_round_trip_keeps_order() -> None:
    ring = DeltaRing(3)
    for v in range(1, 6):
        ring.push(_delta(float(v)))
    other = DeltaRing(3)
    other.load_state_dict(
        ring.state_dict(), shapes=SHAPES, dtypes=[torch.float32] * 2, device=torch.device("cpu")
    )
    ring.push(_delta(6.0))
    other.push(_delta(6.0))
    assert _values(other.recent(3)) == _values(ring.recent(3)) == [4.0, 5.0, 6.0]
    assert other.pushed == ring.pushed == 6


# --- step-aware and gap-aware ------------------------------------------------------------------------


@pytest.mark.parametrize("tau", [1, 2, 3, 7])
def test_step_aware_divides_by_staleness(tau: int) -> None:
    comp = _make("step-aware")
    grads = _params(seed=4)
    out = comp.compensate(grads, staleness=tau, theta_then=_params(), theta_now=_params())
    for o, g in zip(out, grads, strict=True):
        torch.testing.assert_close(o, g / tau, rtol=0, atol=0)
    assert comp.stats()["relative_correction_mean"] == pytest.approx(1 - 1 / tau)


def test_gap_aware_penalises_large_gaps_and_leaves_small_ones() -> None:
    comp = _make("gap-aware")
    base = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    for _ in range(5):  # every parameter moves by 0.1 per update: average step Ĉ = 0.1 exactly
        comp.observe_update([torch.full(s, 0.1, dtype=torch.float64) for s in SHAPES])
    gap = [torch.full(s, 0.05, dtype=torch.float64) for s in SHAPES]
    gap[0][0, 0] = 0.5  # five average steps: divided by 5
    gap[0][1, 1] = -1.0  # ten average steps the other way: divided by 10
    gap[1][2] = 0.1  # exactly one step: untouched
    grads = [torch.ones(s, dtype=torch.float64) for s in SHAPES]
    out = comp.compensate(grads, staleness=5, theta_then=base, theta_now=gap)
    expected = [torch.ones(s, dtype=torch.float64) for s in SHAPES]
    expected[0][0, 0] = 1 / 5
    expected[0][1, 1] = 1 / 10
    for o, e in zip(out, expected, strict=True):
        torch.testing.assert_close(o, e)
    assert 0 < comp.stats()["relative_correction_mean"] < 1


def test_gap_aware_average_step_is_a_bias_corrected_ema() -> None:
    comp = _make("gap-aware", alpha=0.5)
    comp.observe_update([torch.full(s, 0.2, dtype=torch.float64) for s in SHAPES])
    comp.observe_update([torch.full(s, -0.4, dtype=torch.float64) for s in SHAPES])
    # C = 0.5·(0.5·0.2) + 0.5·0.4 = 0.25, bias 1 − 0.25 = 0.75, Ĉ = 1/3; a gap of 1 divides by 3
    base = [torch.zeros(s, dtype=torch.float64) for s in SHAPES]
    now = [torch.ones(s, dtype=torch.float64) for s in SHAPES]
    grads = [torch.ones(s, dtype=torch.float64) for s in SHAPES]
    out = comp.compensate(grads, staleness=2, theta_then=base, theta_now=now)
    for o in out:
        torch.testing.assert_close(o, torch.full_like(o, 1 / 3))
    assert len(comp.state_tensors()) >= len(SHAPES)


def test_penalty_compensators_hold_no_parameter_state() -> None:
    for name in ("none", "step-aware", "fisher"):
        comp = _make(name)
        _run_sequence(comp, seed=3)
        assert all(t.dim() == 0 for t in comp.state_tensors())
