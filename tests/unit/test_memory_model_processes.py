"""The byte model of executor processes (``MemorySettings.executors="processes"``, memory_model.py
"Executor processes"): the shared version slots the process clock allocates, counted exactly; compensator
statistics per executor, Iter-Fisher's shared delta ring, Gap-Aware's shared average step and the shared
tuning state (λ and the EMAs, or DC-ASGD-a's mean square) once per stage, as allocated; planned bytes of the
search equal to the model's total; a removed worker frees its slots and statistics; the slot tables counted
as allocated."""

from __future__ import annotations

from pathlib import Path
from threading import Lock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.compensation import CompensatorSettings
from ferret_core.compensation.ring import COUNTERS
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.slots import slots_needed, stage_versions
from ferret_core.engine.processes.tuning import StageTunings
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings, process_version_slots, slot_table_bytes
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.profile import ModelProfile
from ferret_core.staleness import ring_capacity
from tests.unit.test_engine_support import make_plan

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"
MNISTNET = ModelProfile.load(PROFILES / "mnistnet.json")


def _model(plan: Plan, compensator: str = "iter-fisher-lean", executors: str = "processes") -> MemoryModel:
    settings = MemorySettings(compensator=compensator, executors=executors)
    return MemoryModel(StageGeometry.from_profile(MNISTNET, plan.partition), MNISTNET, settings)


@given(st.integers(1, 4), st.integers(1, 4), st.integers(0, 3))
def test_the_model_counts_the_slots_the_clock_allocates(workers: int, stages: int, stage: int) -> None:
    stage = min(stage, stages - 1)
    assert process_version_slots(workers, stages, stage) == slots_needed(workers, stages, stage)
    assert slots_needed(workers, stages, stage) == 1 + workers + workers * (stages - stage) + 1 + 1


@pytest.mark.parametrize(("stages", "workers"), [(1, 1), (1, 2), (2, 2), (3, 1)])
def test_slot_bytes_are_k_copies_of_each_stage_for_the_live_workers(stages: int, workers: int) -> None:
    plan = make_plan(stages, workers, num_units=MNISTNET.num_units)
    model = _model(plan, compensator="none")
    parts = model.breakdown(plan.workers)
    weights = StageGeometry.from_profile(MNISTNET, plan.partition).weights
    slots = sum(process_version_slots(workers, stages, j) * w for j, w in enumerate(weights)) * 4
    assert parts["version_slots"] + parts["shared_version_slots"] == slots
    assert "versions" not in parts
    assert sum(parts.values()) == model.total(plan.workers)


@pytest.mark.parametrize(("stages", "workers"), [(1, 1), (1, 2), (2, 2), (3, 1)])
def test_the_slot_tables_are_counted_as_the_clock_allocates_them(stages: int, workers: int) -> None:
    plan = make_plan(stages, workers, num_units=MNISTNET.num_units)
    parts = _model(plan, compensator="none").breakdown(plan.workers)
    initial = [StageVersion(j, 0, (torch.zeros(3),), ()) for j in range(stages)]
    tables = [stage.meta.numel() * stage.meta.element_size() for stage in stage_versions(initial, workers, Lock)]
    assert tables == [slot_table_bytes(workers, stages, j) for j in range(stages)]
    assert parts["version_slot_tables"] + parts["shared_version_slot_tables"] == sum(tables)


def test_compensator_statistics_are_counted_per_executor_and_freed_by_removal() -> None:
    two = make_plan(1, 2, num_units=MNISTNET.num_units)
    one = make_plan(1, 2, num_units=MNISTNET.num_units, live=[True, False])
    threads = _model(two, executors="threads").breakdown(two.workers)
    processes = _model(two).breakdown(two.workers)
    # v_r, v_a once (shared), with λ and the int64 flag beside them; each executor's correction accumulator
    assert processes["compensator_moments"] == threads["compensator_moments"] + 8 + 8
    assert processes["compensator_counters"] == 2 * 8 and threads["compensator_counters"] == 8 + 8  # + λ
    removed = _model(one)
    total_w = sum(StageGeometry.from_profile(MNISTNET, two.partition).weights) * 4
    # removing a worker frees its replica and stash slots (2 copies at one stage) and its statistics
    assert _model(two).total(two.workers) - removed.total(one.workers) >= 2 * total_w + 8


@settings(max_examples=25, deadline=None)
@given(st.floats(0.2, 4.0))
def test_the_planners_bytes_are_the_models_total(multiple: float) -> None:
    memory = MemorySettings(compensator="iter-fisher-lean", executors="processes")
    planner = Planner(MNISTNET, PlannerSettings(arrival_interval=multiple * MNISTNET.sequential_time, memory=memory))
    plan = planner.plan(None)
    model = MemoryModel.for_plan(plan, MNISTNET, memory)
    assert plan.planned_bytes == model.total(plan.workers)
    assert plan.memory_breakdown == model.breakdown(plan.workers)
    floor = planner.plan(plan.min_feasible_bytes)
    assert floor.planned_bytes <= plan.min_feasible_bytes


def test_processes_are_an_engine_variant() -> None:
    with pytest.raises(ConfigError, match="variant='engine'"):
        MemorySettings(variant="paper", executors="processes")
    with pytest.raises(ConfigError, match="executors must be one of"):
        MemorySettings(executors="gpus")


@pytest.mark.parametrize(("stages", "workers"), [(1, 2), (2, 2), (3, 1)])
def test_the_shared_delta_ring_is_counted_once_per_stage_as_the_clock_allocates_it(stages: int, workers: int) -> None:
    plan = make_plan(stages, workers, num_units=MNISTNET.num_units)
    processes = _model(plan, compensator="iter-fisher").breakdown(plan.workers)
    threads = _model(plan, compensator="iter-fisher", executors="threads").breakdown(plan.workers)
    weights = StageGeometry.from_profile(MNISTNET, plan.partition).weights
    rings = [  # what ProcessClock.start allocates: one per stage that can be stale
        SharedDeltas(j, [torch.zeros(w)], ring_capacity(plan, j))
        for j, w in enumerate(weights)
        if ring_capacity(plan, j) > 0
    ]
    assert rings and processes["compensator_ring"] == sum(r.nbytes() for r in rings)
    assert processes["compensator_ring"] == threads["compensator_ring"] + len(rings) * COUNTERS * 8  # + counters
    tunings = StageTunings()  # what ProcessClock allocates at each stage's first executor
    states = [
        tunings.get(j, [torch.zeros(w)], "iter-fisher", CompensatorSettings(), ring_capacity(plan, j))
        for j, w in enumerate(weights)
    ]
    assert processes["compensator_moments"] == tunings.nbytes() == sum(t.nbytes() for t in states if t is not None)
    assert processes["compensator_moments"] == threads["compensator_moments"] + len(rings) * 16  # + λ, the flag


@pytest.mark.parametrize(("stages", "workers"), [(1, 2), (2, 2), (3, 1)])
def test_gap_awares_shared_average_is_counted_once_per_stage_as_the_clock_allocates_it(
    stages: int, workers: int
) -> None:
    plan = make_plan(stages, workers, num_units=MNISTNET.num_units)
    processes = _model(plan, compensator="gap-aware").breakdown(plan.workers)
    threads = _model(plan, compensator="gap-aware", executors="threads").breakdown(plan.workers)
    weights = StageGeometry.from_profile(MNISTNET, plan.partition).weights
    averages = [  # what ProcessClock.start allocates: one per stage that can be stale
        SharedStepAverage(j, [torch.zeros(w)]) for j, w in enumerate(weights) if ring_capacity(plan, j) > 0
    ]
    assert averages and processes["compensator_moments"] == sum(a.nbytes() for a in averages)
    assert processes["compensator_moments"] == threads["compensator_moments"] + len(averages) * 8  # + n, not × N
    assert processes["compensator_counters"] == workers * threads["compensator_counters"]  # each executor's own
