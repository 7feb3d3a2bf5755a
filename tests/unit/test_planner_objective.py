"""The planner's accuracy objective (docs/planner.md reading 13): properties over random profiles, costs and
budgets (hypothesis), and the expected-staleness replay it ranks with."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.errors import ConfigError, InfeasibleBudgetError
from ferret_core.plan import WorkerConfig
from ferret_core.planning.expected_staleness import replay_staleness
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.planning.staleness_cost import StalenessCost
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.staleness import bound_for_workers

from .planner_fixtures import golden_a

unit = st.tuples(
    st.floats(0.2, 3.0),  # t_f
    st.floats(0.2, 6.0),  # t_b
    st.integers(1, 50_000),  # params
    st.integers(1, 5_000),  # activations
)
memory_settings = st.sampled_from(
    [MemorySettings(), MemorySettings(in_flight="schedule", compensator="none"), MemorySettings.paper_elements()]
)


@st.composite
def profiles_and_settings(draw: st.DrawFn) -> tuple[ModelProfile, PlannerSettings]:
    units = draw(st.lists(unit, min_size=1, max_size=3))
    layers = tuple(LayerProfile(f"u{i}", tf, tb, w, a) for i, (tf, tb, w, a) in enumerate(units))
    profile = ModelProfile("random", (draw(st.integers(1, 2000)),), layers)
    base = PlannerSettings(
        arrival_interval=draw(st.floats(0.5, 2.0)) * profile.max_forward_time,
        decay=draw(st.sampled_from([0.0, 0.05, 0.5])),
        memory=draw(memory_settings),
    )
    return profile, base


@st.composite
def costs(draw: st.DrawFn) -> StalenessCost:
    """A measured-looking cost: random accuracies for fractions and staleness points."""
    fractions = {1.0: draw(st.floats(10, 90)), 0.5: draw(st.floats(5, 90)), 0.25: draw(st.floats(1, 90))}
    stale = {float(t): draw(st.floats(1, 95)) for t in draw(st.sets(st.integers(1, 8), min_size=1, max_size=4))}
    return StalenessCost.from_accuracies(fractions, stale)


def _budget(planner: Planner, fraction: float) -> int:
    top = planner.plan(None).planned_bytes
    low = planner.min_feasible_bytes
    return int(low + fraction * (top - low))


@settings(deadline=None, max_examples=25)
@given(profiles_and_settings(), st.one_of(st.none(), st.floats(0.0, 1.2)))
def test_with_zero_cost_the_accuracy_objective_chooses_the_rate_plan(
    case: tuple[ModelProfile, PlannerSettings], fraction: float | None
) -> None:
    profile, base = case
    rate = Planner(profile, base)
    accuracy = Planner(
        profile, dataclasses.replace(base, objective="accuracy", staleness_cost=StalenessCost.zero())
    )
    budget = None if fraction is None else _budget(rate, fraction)
    chosen, reference = accuracy.plan(budget), rate.plan(budget)
    assert dataclasses.replace(chosen, objectives=None) == reference
    assert chosen.objectives is not None and chosen.objectives.discount == 1.0
    assert chosen.objectives.accuracy == chosen.objectives.rate == reference.adaptation_rate


@settings(deadline=None, max_examples=20)
@given(profiles_and_settings(), costs(), st.one_of(st.none(), st.floats(0.0, 1.2)))
def test_the_accuracy_plan_fits_the_budget_and_maximises_its_objective(
    case: tuple[ModelProfile, PlannerSettings], cost: StalenessCost, fraction: float | None
) -> None:
    profile, base = case
    rate = Planner(profile, base)
    accuracy = Planner(profile, dataclasses.replace(base, objective="accuracy", staleness_cost=cost))
    budget = None if fraction is None else _budget(rate, fraction)
    plan = accuracy.plan(budget)  # never infeasible where the rate objective has a plan
    if budget is not None:
        assert plan.planned_bytes <= budget
    assert plan.objectives is not None and plan.objectives.accuracy is not None
    # the rate plan, scored by the same objective, is never better (unless the stream-bound tier rules)
    other = accuracy.objectives(rate.plan(budget))
    assert other.accuracy is not None
    if not accuracy.stream_bound:
        assert plan.objectives.accuracy >= other.accuracy * (1 - 1e-9)


@settings(deadline=None, max_examples=15)
@given(profiles_and_settings(), costs())
def test_an_infeasible_budget_stays_infeasible(case: tuple[ModelProfile, PlannerSettings], cost: StalenessCost) -> None:
    profile, base = case
    accuracy = Planner(profile, dataclasses.replace(base, objective="accuracy", staleness_cost=cost))
    with pytest.raises(InfeasibleBudgetError):
        accuracy.plan(accuracy.min_feasible_bytes - 1)


@given(costs(), st.floats(0.0, 20.0), st.floats(0.0, 20.0))
def test_the_discount_is_monotone_in_staleness(cost: StalenessCost, a: float, b: float) -> None:
    low, high = sorted((a, b))
    assert 0.0 <= cost.discount(high) <= cost.discount(low) <= cost.discount(0.0) == 1.0


@settings(deadline=None, max_examples=15)
@given(profiles_and_settings(), costs(), st.floats(0.0, 1.0))
def test_a_dearer_staleness_never_raises_the_plans_discount(
    case: tuple[ModelProfile, PlannerSettings], cheap: StalenessCost, factor: float
) -> None:
    """Pointwise d' ≤ d gives a discount ≤ for the same plan (the weighted mean is monotone in d); d'
    scales every worth but τ = 0's by ``factor``, which keeps d' ≤ d everywhere, extrapolation included."""
    profile, base = case
    dear = StalenessCost(cheap.staleness, (1.0, *(w * factor for w in cheap.worth[1:])))
    assert all(dear.discount(t / 4) <= cheap.discount(t / 4) + 1e-12 for t in range(60))
    plan = Planner(profile, base).plan(None)
    with_cheap = Planner(profile, dataclasses.replace(base, staleness_cost=cheap)).objectives(plan)
    with_dear = Planner(profile, dataclasses.replace(base, staleness_cost=dear)).objectives(plan)
    assert with_cheap.discount is not None and with_dear.discount is not None
    assert with_dear.discount <= with_cheap.discount + 1e-12



def test_accuracy_needs_a_cost_and_a_known_objective() -> None:
    with pytest.raises(ConfigError, match="staleness cost"):
        PlannerSettings(objective="accuracy")
    with pytest.raises(ConfigError, match="objective must be one of"):
        PlannerSettings(objective="loss")


def test_a_steep_cost_trades_workers_for_staleness() -> None:
    """Golden case (a) at its paper rate: R_F wants every worker slot; when staleness is worth nothing
    beyond τ = 0 the accuracy objective takes a plan with a lower expected staleness."""
    profile = golden_a()
    base = PlannerSettings(arrival_interval=3.0)
    rate_plan = Planner(profile, base).plan(None)
    steep = StalenessCost((0.0, 1.0), (1.0, 0.0))
    planner = Planner(profile, dataclasses.replace(base, objective="accuracy", staleness_cost=steep))
    plan = planner.plan(None)
    assert plan.objectives is not None and plan.objectives.accuracy is not None
    rate_view = planner.objectives(rate_plan)
    assert max(plan.objectives.expected_staleness) < max(rate_view.expected_staleness)
    assert rate_view.accuracy is not None and plan.objectives.accuracy > rate_view.accuracy


def _workers(n: int, p: int) -> tuple[WorkerConfig, ...]:
    return tuple(WorkerConfig(i, True, False, (1,) * p, (0,) * p) for i in range(n))


@pytest.mark.parametrize("n", [1, 2, 5])
def test_replay_one_stage_n_workers_applies_every_gradient_n_minus_1_late(n: int) -> None:
    expected = replay_staleness(_workers(n, 1), (1.0,), (2.0 * n - 1.0,), 2.0)  # a worker takes exactly N·t^d
    assert expected.mean == (n - 1,)
    assert expected.trained_fraction == 1.0


def test_replay_one_worker_is_pipedreams_staleness() -> None:
    """One worker, P stages, every item trained: stage i's gradients are P − 1 − i updates late."""
    expected = replay_staleness(_workers(1, 3), (1.0, 1.0, 1.0), (1.0, 1.0, 1.0), 2.0)
    assert expected.mean == (2.0, 1.0, 0.0)
    assert expected.trained_fraction == 1.0


def test_replay_counts_busy_skips_and_never_exceeds_the_bound() -> None:
    workers = _workers(2, 2)
    expected = replay_staleness(workers, (1.0, 1.0), (2.0, 2.0), 1.0)  # each worker needs 3 of its 2 intervals
    assert 0.0 < expected.trained_fraction < 1.0
    assert all(m <= bound_for_workers(workers, j, 2) for j, m in enumerate(expected.mean))


def test_replay_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="live worker"):
        replay_staleness((WorkerConfig(0, False, False, (1,), (0,)),), (1.0,), (1.0,), 1.0)
    with pytest.raises(ConfigError, match="per-stage"):
        replay_staleness(_workers(1, 2), (1.0,), (1.0,), 1.0)
