"""A plan's bytes by stage and by host (ferret_core/planning/host_memory.py) and the planner's per-host
budget: the stages' bytes and the record path's sum to the one-host total for any configuration, one host
holds exactly that total, and every plan made under a per-host budget keeps every host within it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.errors import ConfigError, InfeasibleHostBudgetError
from ferret_core.plan import Plan
from ferret_core.planning.admission_queue import AdmissionQueue
from ferret_core.planning.host_memory import FOLLOWER_SLOTS, HostBudget, follower_bytes, host_bytes
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.placement import stage_owners
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.planning.residency import StageSizes, cap_residency, cap_stage_activations
from ferret_core.profile import LayerProfile, ModelProfile

REPO = Path(__file__).resolve().parents[2]

unit = st.tuples(st.floats(0.05, 5.0), st.floats(0.05, 10.0), st.integers(1, 200_000), st.integers(1, 20_000))
cap_settings = st.sampled_from(
    [
        MemorySettings(executors="processes", compensator="iter-fisher"),
        MemorySettings(executors="processes", compensator="gap-aware", admission_queue=AdmissionQueue(0.02, 8)),
        MemorySettings(executors="processes", compensator="none", optimizer="adam"),
        MemorySettings(compensator="dc-asgd-a"),  # thread executors: Python-owned versions
        MemorySettings(compensator="iter-fisher-lean", teacher_copy=True, replay_items=20),
    ]
)


@st.composite
def planners(draw: st.DrawFn, hosts: HostBudget | None = None) -> Planner:
    units = draw(st.lists(unit, min_size=1, max_size=5))
    layers = tuple(LayerProfile(f"u{i}", tf, tb, w, a) for i, (tf, tb, w, a) in enumerate(units))
    profile = ModelProfile("random", (draw(st.integers(1, 3000)),), layers)
    settings = PlannerSettings(
        arrival_interval=draw(st.floats(0.3, 3.0)) * profile.max_forward_time,
        memory=draw(cap_settings),
        hosts=hosts,
    )
    return Planner(profile, settings)


def _model(planner: Planner, plan: Plan) -> MemoryModel:
    memory = planner.settings.memory
    if memory.admission_queue is not None:
        memory = dataclasses.replace(memory, admission_queue=memory.admission_queue.resolved(plan.decay))
    return MemoryModel.for_plan(plan, planner.profile, memory)


@settings(max_examples=60, deadline=None)
@given(planners(), st.floats(0.0, 1.0), st.integers(1, 4))
def test_the_stages_and_the_record_path_sum_to_the_plans_bytes(planner: Planner, fraction: float, hosts: int) -> None:
    low, top = planner.min_feasible_bytes, planner.plan(None).planned_bytes
    plan = planner.plan(int(low + fraction * (top - low)))
    model = _model(planner, plan)
    stages, record = model.stage_breakdown(plan.workers)
    assert len(stages) == plan.num_stages
    assert sum(sum(part.values()) for part in stages) + sum(record.values()) == plan.planned_bytes
    # by component, the stages add up to the plan's breakdown (what the planner reports)
    summed: dict[str, int] = dict(record)
    for part in stages:
        for name, value in part.items():
            summed[name] = summed.get(name, 0) + value
    assert {k: v for k, v in summed.items() if v} == {k: v for k, v in plan.memory_breakdown.items() if v}
    per_host = host_bytes(model, plan.workers, hosts)
    owners = stage_owners(plan.num_stages, hosts)
    followers = sum(follower_bytes(model, j) for j in range(plan.num_stages) if owners[j] != 0)
    assert len(per_host) == hosts and sum(per_host) == plan.planned_bytes + followers
    if hosts == 1:
        assert per_host == (plan.planned_bytes,)


@given(
    st.integers(1, 5000),
    st.lists(st.tuples(st.integers(1, 9000), st.integers(0, 9000)), min_size=1, max_size=5),
    st.booleans(),
    st.integers(0, 3),
)
def test_the_cap_bound_by_stage_sums_to_the_cap_bound(sample: int, stages: list, recompute: bool, wait: int) -> None:
    sizes = StageSizes(sample, tuple(o for o, _ in stages), tuple(i for _, i in stages))
    by_stage = cap_stage_activations(sizes, recompute, wait_slots=wait)
    assert sum(by_stage) == cap_residency(sizes, recompute, wait_slots=wait).peak
    assert all(b > 0 for b in by_stage)


@settings(max_examples=20, deadline=None)
@given(st.data(), st.integers(2, 4), st.floats(0.0, 1.0))
def test_every_plan_under_a_per_host_budget_keeps_each_host_within_it(
    data: st.DataObject, hosts: int, f: float
) -> None:
    free = data.draw(planners(HostBudget(hosts)))  # bytes per host reported, no per-host budget
    with pytest.raises(InfeasibleHostBudgetError) as caught:  # a budget of 0 names the smallest that plans
        Planner(free.base_profile, dataclasses.replace(free.settings, hosts=HostBudget(hosts, 0))).warm()
    smallest, top = caught.value.min_host_bytes, max(free.plan(None).host_bytes)
    budget = int(smallest + f * (top - smallest))
    bounded = Planner(free.base_profile, dataclasses.replace(free.settings, hosts=HostBudget(hosts, budget)))
    plan = bounded.plan(None)
    assert len(plan.host_bytes) == hosts and max(plan.host_bytes) <= budget
    assert plan.planned_bytes >= bounded.min_feasible_bytes >= free.min_feasible_bytes
    # a looser per-host budget never plans a lower R_F (the path is the same; more of it fits)
    assert free.plan(None).adaptation_rate >= plan.adaptation_rate


def test_hosts_without_a_budget_plan_as_one_host_and_report_bytes_per_host() -> None:
    profile = _mnistnet()
    memory = MemorySettings(executors="processes", compensator="iter-fisher")
    one = Planner(profile, PlannerSettings(memory=memory)).plan(None)
    reported = Planner(profile, PlannerSettings(memory=memory, hosts=HostBudget(3))).plan(None)
    assert (reported.partition, reported.workers) == (one.partition, one.workers)
    assert reported.planned_bytes == one.planned_bytes
    assert one.host_bytes == () and len(reported.host_bytes) == 3
    assert Plan.from_dict(json.loads(json.dumps(reported.to_dict()))).host_bytes == reported.host_bytes
    assert "host_bytes" not in one.to_dict()  # the one-host schema is unchanged


def test_a_per_host_budget_below_every_plan_names_the_smallest_that_plans() -> None:
    profile = _mnistnet()
    memory = MemorySettings(executors="processes", compensator="iter-fisher")
    with pytest.raises(InfeasibleHostBudgetError) as caught:
        Planner(profile, PlannerSettings(memory=memory, hosts=HostBudget(3, 1_000_000))).plan(None)
    smallest = caught.value.min_host_bytes
    assert "raise the per-host budget to at least" in str(caught.value) and smallest > 1_000_000
    plan = Planner(profile, PlannerSettings(memory=memory, hosts=HostBudget(3, smallest))).plan(None)
    assert max(plan.host_bytes) <= smallest


def test_the_trainers_follower_copies_are_counted_on_rank_0() -> None:
    profile = _mnistnet()
    memory = MemorySettings(executors="processes", compensator="none")
    plan = Planner(profile, PlannerSettings(memory=memory, max_stages=1)).plan(None)
    model = MemoryModel.for_plan(plan, profile, memory)
    rank0, rank1 = host_bytes(model, plan.workers, 2)
    _, record = model.stage_breakdown(plan.workers)
    weights = sum(layer.params for layer in profile.layers) * 4
    assert rank0 == sum(record.values()) + FOLLOWER_SLOTS * weights + (1 + 2 * FOLLOWER_SLOTS) * 8
    assert rank0 + rank1 == plan.planned_bytes + rank0 - sum(record.values())


def test_bytes_by_stage_need_the_cap_bound() -> None:
    profile = _mnistnet()
    plan = Planner(profile, PlannerSettings(memory=MemorySettings(in_flight="schedule"))).plan(None)
    for memory in (MemorySettings(in_flight="schedule"), MemorySettings.paper_elements()):
        model = MemoryModel.for_plan(plan, profile, memory)
        with pytest.raises(ConfigError, match="in_flight='cap'"):
            model.stage_breakdown(plan.workers)
    with pytest.raises(ConfigError, match="per-host budget needs the engine byte model"):
        PlannerSettings(memory=MemorySettings(in_flight="schedule"), hosts=HostBudget(2, 10**9))
    with pytest.raises(ConfigError, match=">= 1 host"):
        HostBudget(0)


def _mnistnet() -> ModelProfile:
    return ModelProfile.from_dict(json.loads((REPO / "benchmarks/profiles/mnistnet-batches.json").read_text()))
