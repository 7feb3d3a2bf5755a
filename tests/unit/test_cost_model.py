"""R_F and M_F of eq. ferret-svre, and the S1–S4 deltas against the appendix's closed forms (§3.12)."""

from __future__ import annotations

import math

import pytest

from ferret_core.errors import ProfileError
from ferret_core.plan import Partition, backprop_period
from ferret_core.planning.cost_model import (
    RateModel,
    StageGeometry,
    num_worker_slots,
    paper_worker_elements,
)
from ferret_core.planning.search import accumulation_increment

from .planner_fixtures import golden_a, golden_b

C = 0.05


@pytest.fixture
def geom_a() -> StageGeometry:
    return StageGeometry.from_profile(golden_a(), Partition((0, 1, 2, 4)))


def a_term(g: StageGeometry, c: float, i: int, j: int, recompute: int, lcm: int) -> float:
    """A_{i,j} of eq. ferret-svre, written out literally (V_D = 1)."""
    p = g.num_stages
    exponent = (p + j) * g.t_f + (p - i + j) * g.t_b + recompute * (p - i + j) * g.t_f
    return math.exp(-c * exponent) / (lcm * (g.t_f + g.t_b + recompute * g.t_f))


def test_geometry_of_golden_partition(geom_a: StageGeometry) -> None:
    assert (geom_a.t_f, geom_a.t_b) == (3, 6)
    assert geom_a.weights == (320, 18496, 1181066)
    assert geom_a.activations == (5408, 9216, 138)
    assert geom_a.recompute_savings == (0, 0, 10)


def test_golden_a_unconstrained_rate_and_memory(geom_a: StageGeometry) -> None:
    rm = RateModel(geom_a, C)
    n = num_worker_slots(geom_a, 3.0, recompute=False)
    assert n == 3
    rate = n * rm.worker_rate(False, (1, 1, 1), (0, 0, 0))
    assert rate == pytest.approx(0.15680749731239846, rel=1e-14)
    assert n * paper_worker_elements(geom_a, False, (1, 1, 1), (0, 0, 0)) == 3761436


def test_worker_slots_use_recomputation_and_ignore_float_noise(geom_a: StageGeometry) -> None:
    assert num_worker_slots(geom_a, 3.0, recompute=True) == 4  # ⌈(3 + 6 + 3)/3⌉
    assert num_worker_slots(geom_a, 3.0 * (1 + 1e-13), recompute=False) == 3  # 2.999…: no extra worker
    assert num_worker_slots(geom_a, 100.0, recompute=False) == 1


def test_golden_b_initial_configuration() -> None:
    g = StageGeometry.from_profile(golden_b(), Partition((0, 1, 2, 3, 4, 5)))
    n = num_worker_slots(g, 1.0, recompute=False)
    assert n == 3
    rm = RateModel(g, 0.1)
    ones, zeros = (1,) * 5, (0,) * 5
    assert n * rm.worker_rate(False, ones, zeros) == pytest.approx(0.34633760008250614, rel=1e-14)
    assert n * paper_worker_elements(g, False, ones, zeros) == 49500


def test_rate_is_a_literal_sum_of_a_terms(geom_a: StageGeometry) -> None:
    rm = RateModel(geom_a, C)
    acc, om = (2, 1, 1), (1, 0, 0)
    w = geom_a.weights
    expected = 0.0
    for i in range(3):
        lcm = backprop_period(om, i)
        expected += w[i] / sum(w) / acc[i] * sum(a_term(geom_a, C, i, j, 1, lcm) for j in range(acc[i]))
    assert rm.worker_rate(True, acc, om) == pytest.approx(expected, rel=1e-14)


def test_lcm_factor() -> None:
    assert backprop_period((2, 1, 0), 0) == 6
    assert backprop_period((2, 1, 0), 1) == 2
    assert backprop_period((2, 1, 0), 2) == 1


def test_zero_parameter_model_is_rejected() -> None:
    from .planner_fixtures import profile_from

    g = StageGeometry.from_profile(profile_from(((1, 1, 0, 5),)), Partition((0, 1)))
    with pytest.raises(ProfileError, match="no parameters"):
        RateModel(g, 0.1)


# ---- S1–S4: re-evaluation against the appendix's closed forms, where they agree (DESIGN §3.12) -----


def _rate(rm: RateModel, r: bool, acc: tuple[int, ...], om: tuple[int, ...]) -> float:
    return rm.worker_rate(r, acc, om)


def test_s1_closed_form_agrees(geom_a: StageGeometry) -> None:
    """eq. dsvre-ar: ΔR = Σ_i share_i (1/c^a) Σ_j (B_ij − C_ij); ΔM = −Σ_i versions_i Σ_l |â_l|."""
    rm = RateModel(geom_a, C)
    acc, om = (1, 2, 1), (0, 0, 0)
    w = geom_a.weights
    closed = 0.0
    for i in range(3):
        lcm = backprop_period(om, i)
        closed += (
            w[i]
            / sum(w)
            / acc[i]
            * sum(a_term(geom_a, C, i, j, 1, lcm) - a_term(geom_a, C, i, j, 0, lcm) for j in range(acc[i]))
        )
    assert _rate(rm, True, acc, om) - _rate(rm, False, acc, om) == pytest.approx(closed, rel=1e-12)
    d_mem = paper_worker_elements(geom_a, True, acc, om) - paper_worker_elements(geom_a, False, acc, om)
    versions = [1 + math.ceil((3 - i - 1) / acc[i]) - om[i] for i in range(3)]
    assert d_mem == -sum(v * s for v, s in zip(versions, geom_a.recompute_savings, strict=True))


def test_s2_rate_closed_form_agrees_but_memory_closed_form_does_not() -> None:
    g = StageGeometry.from_profile(golden_b(), Partition((0, 1, 2, 3, 4, 5)))
    c = 0.1
    rm = RateModel(g, c)
    ones, zeros = (1,) * 5, (0,) * 5
    delta = accumulation_increment(5, 0, 1)
    assert delta == 1
    new_acc = (2, 1, 1, 1, 1)
    d_rate = _rate(rm, False, new_acc, zeros) - _rate(rm, False, ones, zeros)
    share = 1000 / 5000
    a = [a_term(g, c, 0, k, 0, 1) for k in range(2)]
    closed = share * (a[1] / 2 - 1 * a[0] / (2 * 1))  # eq. dsvre-ga with c^a = 1, Δc^a = 1
    assert d_rate == pytest.approx(closed, rel=1e-12)
    d_mem = paper_worker_elements(g, False, new_acc, zeros) - paper_worker_elements(g, False, ones, zeros)
    assert d_mem == -2200  # two versions (5 → 3) of |w_0| + |a_0| = 1100
    closed_mem = -(1000 + 100)  # eq. dsvre-ga's ΔM counts one version only: wrong here (DESIGN §3.12)
    assert d_mem != closed_mem


def test_s3_memory_closed_form_agrees_but_rate_closed_form_does_not() -> None:
    g = StageGeometry.from_profile(golden_b(), Partition((0, 1, 2, 3, 4, 5)))
    c = 0.1
    rm = RateModel(g, c)
    # stage j = 1 with c^a = 3 (⌈3/3⌉ = 1: Δc^a infinite ⇒ S3: c^a → 1, c^o → P−1−j = 3)
    before_acc, before_om = (1, 3, 1, 1, 1), (0, 0, 0, 0, 0)
    after_acc, after_om = (1, 1, 1, 1, 1), (0, 3, 0, 0, 0)
    assert accumulation_increment(5, 1, 3) is None
    d_mem = paper_worker_elements(g, False, after_acc, after_om) - paper_worker_elements(
        g, False, before_acc, before_om
    )
    assert d_mem == -math.ceil(3 / 3) * (1000 + 100)  # eq. dsvre-bpo's ΔM
    d_rate = _rate(rm, False, after_acc, after_om) - _rate(rm, False, before_acc, before_om)
    # eq. dsvre-bpo's ΔR: sums i ≤ P−1−j with the new LCM but keeps c^a_{n,j}: not the re-evaluation
    share = 1000 / 5000
    closed = 0.0
    for i in range(0, 5 - 1 - 1 + 1):
        lcm_old = backprop_period(before_om, i)
        lcm_new = math.lcm(lcm_old, 5 - 1)
        ca = before_acc[i]
        closed += share * sum(a_term(g, c, i, k, 0, lcm_new) - a_term(g, c, i, k, 0, lcm_old) for k in range(ca)) / ca
    assert d_rate < 0
    assert d_rate != pytest.approx(closed, rel=1e-6)


def test_s4_closed_form_agrees(geom_a: StageGeometry) -> None:
    rm = RateModel(geom_a, C)
    acc, om = (1, 1, 1), (2, 1, 0)
    w = geom_a.weights
    closed_rate = -sum(
        w[i] / sum(w) / acc[i] * sum(a_term(geom_a, C, i, j, 0, backprop_period(om, i)) for j in range(acc[i]))
        for i in range(3)
    )
    assert -_rate(rm, False, acc, om) == pytest.approx(closed_rate, rel=1e-14)
    closed_mem = -sum((1 + math.ceil((3 - i - 1) / acc[i]) - om[i]) * (w[i] + geom_a.activations[i]) for i in range(3))
    assert -paper_worker_elements(geom_a, False, acc, om) == closed_mem
