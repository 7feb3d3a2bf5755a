"""Golden values from an independent reference of the paper's formulas (elements, V_D = 1), for the planner's
default objective, `rate` (R_F, the paper's); the `accuracy` objective with a zero staleness cost makes the same
plans (`test_planner_objective.py`)."""

from __future__ import annotations

import pytest

from ferret_core.errors import ConfigError, InfeasibleBudgetError
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.partitioning import candidate_caps, candidate_partitions, partition_for_cap
from ferret_core.planning.planner import Planner, PlannerSettings, default_decay

from .planner_fixtures import golden_a, golden_b


@pytest.fixture(scope="module")
def planner_a() -> Planner:
    settings = PlannerSettings(arrival_interval=3.0, decay=0.05, memory=MemorySettings.paper_elements())
    return Planner(golden_a(), settings)


def test_unconstrained_plan(planner_a: Planner) -> None:
    plan = planner_a.plan(None)
    assert plan.partition.boundaries == (0, 1, 2, 4)
    assert plan.num_workers == 3 and plan.live_workers == 3
    assert plan.adaptation_rate == pytest.approx(0.15680749731239846, rel=1e-14)
    assert plan.planned_bytes == 3761436 == plan.paper_memory_elements
    assert all(not w.recompute for w in plan.workers)


@pytest.mark.parametrize(
    ("budget", "live", "rate"),
    [(2429288, 2, 0.10392616856039616), (1214644, 1, 0.05196308428019808)],
)
def test_budgeted_plans(planner_a: Planner, budget: int, live: int, rate: float) -> None:
    plan = planner_a.plan(budget)
    assert plan.live_workers == live
    assert plan.adaptation_rate == pytest.approx(rate, rel=1e-14)
    assert plan.planned_bytes <= budget


def test_minimum_feasible_is_weights_plus_first_activation(planner_a: Planner) -> None:
    profile = golden_a()
    closed_form = profile.total_params + profile.layers[0].activations  # Σ|ŵ| + |â_0| (DESIGN §3.7)
    assert closed_form == 1205290
    assert planner_a.min_feasible_bytes == closed_form
    plan = planner_a.plan(1205290)
    assert plan.planned_bytes == 1205290
    live = [w for w in plan.workers if w.live]
    assert plan.num_stages == 1 and len(live) == 1 and live[0].recompute
    with pytest.raises(InfeasibleBudgetError) as info:
        planner_a.plan(1205289)
    assert info.value.min_feasible_bytes == 1205290
    assert "1205290" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_first_step_of_golden_b_is_s2_on_worker0_stage0() -> None:
    settings = PlannerSettings(
        arrival_interval=1.0, decay=0.1, memory=MemorySettings.paper_elements(), recompute_options=(False,)
    )
    planner = Planner(golden_b(), settings)
    plan = planner.plan(49500 - 1)
    assert plan.partition.boundaries == (0, 1, 2, 3, 4, 5)
    first = plan.steps[0]
    assert (first.kind, first.worker, first.stage, first.delta_bytes) == ("S2", 0, 0, -2200)
    assert plan.workers[0].accumulation[0] == 2


def test_candidate_caps_are_at_least_the_slowest_unit() -> None:
    caps = candidate_caps(golden_a())
    assert caps == pytest.approx([9, 12, 15, 15.6, 18, 18.6])
    assert partition_for_cap(golden_a(), 9).boundaries == (0, 1, 2, 4)
    assert partition_for_cap(golden_a(), 12).boundaries == (0, 2, 4)
    assert partition_for_cap(golden_a(), 18.6).boundaries == (0, 4)
    assert [p.boundaries for _, p in candidate_partitions(golden_a())] == [(0, 1, 2, 4), (0, 2, 4), (0, 3, 4), (0, 4)]


def test_defaults_follow_the_paper() -> None:
    profile = golden_a()
    planner = Planner(profile)
    assert planner.arrival_interval == 3.0  # max_i t̂_i^f
    assert planner.decay == pytest.approx(default_decay(profile))


def test_planned_bytes_use_the_same_function_as_the_search() -> None:
    planner = Planner(golden_a(), PlannerSettings(arrival_interval=3.0, decay=0.05))
    plan = planner.plan(None)
    assert sum(plan.memory_breakdown.values()) == plan.planned_bytes
    assert plan.planned_bytes > plan.paper_memory_elements * 4  # extras are counted


@pytest.mark.parametrize("bad", [{"arrival_interval": 0.0}, {"decay": -1.0}, {"max_workers": 0}])
def test_invalid_settings(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        PlannerSettings(**bad)  # type: ignore[arg-type]


def test_negative_budget_is_rejected(planner_a: Planner) -> None:
    with pytest.raises(ConfigError, match=">= 0"):
        planner_a.plan(-1)


def test_max_workers_caps_slots() -> None:
    settings = PlannerSettings(arrival_interval=0.5, decay=0.05, max_workers=2, memory=MemorySettings.paper_elements())
    plan = Planner(golden_a(), settings).plan(None)
    assert plan.num_workers <= 2
