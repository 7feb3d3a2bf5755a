"""Planner invariants over random profiles and budgets (hypothesis)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ferret_core.errors import InfeasibleBudgetError
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import LayerProfile, ModelProfile

unit = st.tuples(
    st.floats(0.05, 5.0),  # t_f
    st.floats(0.05, 10.0),  # t_b
    st.integers(1, 200_000),  # params
    st.integers(1, 20_000),  # activations
)
memory_settings = st.sampled_from(
    [
        MemorySettings.paper_elements(),
        MemorySettings(),
        MemorySettings(variant="engine"),
        MemorySettings(in_flight="schedule", compensator="fisher"),
        MemorySettings(compensator="none", optimizer="adam"),
        MemorySettings(variant="engine", compensator="gap-aware", replay_items=50),
    ]
)


@st.composite
def planners(draw: st.DrawFn) -> Planner:
    units = draw(st.lists(unit, min_size=1, max_size=6))
    layers = tuple(LayerProfile(f"u{i}", tf, tb, w, a) for i, (tf, tb, w, a) in enumerate(units))
    profile = ModelProfile("random", (draw(st.integers(1, 5000)),), layers)
    multiple = draw(st.floats(0.3, 3.0))
    decay = draw(st.sampled_from([0.0, 0.01, 0.1, 1.0]))
    settings = PlannerSettings(
        arrival_interval=multiple * profile.max_forward_time, decay=decay, memory=draw(memory_settings)
    )
    return Planner(profile, settings)


def _budget(planner: Planner, fraction: float) -> int:
    top = planner.plan(None).planned_bytes
    low = planner.min_feasible_bytes
    return int(low + fraction * (top - low))


@given(planners(), st.floats(0.0, 1.2))
def test_plan_fits_and_partition_covers_every_unit(planner: Planner, fraction: float) -> None:
    budget = _budget(planner, fraction)
    plan = planner.plan(budget)
    assert plan.planned_bytes <= budget
    units = [u for stage in plan.stages for u in stage]
    assert units == list(range(planner.profile.num_units))  # contiguous, each unit once, in order
    assert all(len(stage) >= 1 for stage in plan.stages)
    # the reported bytes are the search's own byte function
    model = MemoryModel.for_plan(plan, planner.profile, planner.settings.memory)
    assert model.total(plan.workers) == plan.planned_bytes
    assert plan.live_workers >= 1
    assert all(len(w.accumulation) == plan.num_stages for w in plan.workers)


@given(planners(), st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_more_budget_never_lowers_the_rate(planner: Planner, f1: float, f2: float) -> None:
    """More budget never gives a worse plan in the planner's order: a lower R_F, or (when one unsplit
    worker keeps up with the stream, docs/planner.md reading 10) one that trains fewer items."""
    low, high = sorted((_budget(planner, f1), _budget(planner, f2)))

    def best(budget: int | None) -> tuple[float, ...]:
        return min(planner.rank(o) for o in planner.options(budget))[:2]

    assert best(high) <= best(low)
    assert best(None) <= best(high)
    if not planner.stream_bound:  # then the order is R_F's
        assert planner.plan(high).adaptation_rate >= planner.plan(low).adaptation_rate
        assert planner.plan(None).adaptation_rate >= planner.plan(high).adaptation_rate


@given(planners())
def test_plans_exist_exactly_from_the_minimum_up(planner: Planner) -> None:
    minimum = planner.min_feasible_bytes
    assert planner.plan(minimum).planned_bytes <= minimum
    try:
        planner.plan(minimum - 1)
    except InfeasibleBudgetError as exc:
        assert exc.min_feasible_bytes == minimum
    else:
        raise AssertionError("a budget below the minimum produced a plan")


@given(st.lists(unit, min_size=1, max_size=6), st.floats(0.3, 3.0), st.sampled_from([0.0, 0.05, 0.5]))
def test_minimum_in_elements_has_the_closed_form(
    units: list[tuple[float, float, int, int]], mult: float, decay: float
) -> None:
    """Σ_l |ŵ_l| + |â_0| (P = 1, recomputation on, one worker; DESIGN §3.7)."""
    layers = tuple(LayerProfile(f"u{i}", tf, tb, w, a) for i, (tf, tb, w, a) in enumerate(units))
    profile = ModelProfile("random", (1,), layers)
    settings = PlannerSettings(
        arrival_interval=mult * profile.max_forward_time, decay=decay, memory=MemorySettings.paper_elements()
    )
    planner = Planner(profile, settings)
    assert planner.min_feasible_bytes == profile.total_params + layers[0].activations


@given(planners(), st.floats(0.0, 1.0))
def test_rate_and_steps_are_consistent(planner: Planner, fraction: float) -> None:
    plan = planner.plan(_budget(planner, fraction))
    unconstrained = planner.plan(None)
    tolerance = 1e-12 * max(1.0, abs(unconstrained.adaptation_rate))  # rounding of re-evaluated sums
    # ΔR ≤ 0 for S2 and S4. S3 resets c^a_{n,j} to 1 (DESIGN §3.12): after S2 raised c^a, the reset can
    # raise R_F under a strong decay (the averaged A_{i,j} of c^a items fall below A_{i,0}/(c^o+1)), so an
    # S3 step may gain rate only where it resets an accumulation > 1.
    accumulation: dict[tuple[int, int], int] = {}
    for step in plan.steps:
        key = (step.worker, step.stage if step.stage is not None else -1)
        if step.kind == "S2":
            accumulation[key] = int(step.detail.split("→")[1].split()[0])
        resets = step.kind == "S3" and accumulation.pop(key, 1) > 1
        assert step.delta_rate <= tolerance or resets, step
    if plan.partition == unconstrained.partition and plan.workers[0].recompute == unconstrained.workers[0].recompute:
        total = unconstrained.adaptation_rate + sum(s.delta_rate for s in plan.steps)
        assert abs(total - plan.adaptation_rate) <= 1e-9 * max(1.0, abs(plan.adaptation_rate))


@given(planners(), st.floats(0.0, 1.0))
def test_incremental_ring_pricing_matches_a_full_recount(planner: Planner, fraction: float) -> None:
    """The search prices the compensator ring incrementally; the plan's breakdown recounts it from
    scratch with ferret_core.staleness. Both must agree (they are the same bytes)."""
    plan = planner.plan(_budget(planner, fraction))
    model = MemoryModel.for_plan(plan, planner.profile, planner.settings.memory)
    assert model.total(plan.workers) == plan.planned_bytes
    assert model.breakdown(plan.workers).get("compensator_ring", 0) == plan.memory_breakdown.get("compensator_ring", 0)
