"""Compensator state is counted, and allocated, only at the stages a plan can make stale (memory_model.py
"Extras"): nothing at staleness bound 0, moments + accumulator (+ a ring of ``bound`` deltas for Alg. 1)
elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.compensation import COMPENSATOR_NAMES, CompensatorSettings, make_compensator
from ferret_core.plan import Plan
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.profile import ModelProfile
from ferret_core.staleness import staleness_bound
from tests.unit.test_engine_support import make_plan, run_plan, stream

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"
MNISTNET = ModelProfile.load(PROFILES / "mnistnet.json")
KEYS = ("compensator_moments", "compensator_counters", "compensator_ring")
COPIES = {"gap-aware": 1, "dc-asgd-a": 1, "iter-fisher": 2, "iter-fisher-cf": 2, "iter-fisher-lean": 2}
LAMBDA_TENSOR = ("iter-fisher", "iter-fisher-cf", "iter-fisher-lean")  # with λ tuned (the default)


def _model(plan: Plan, compensator: str, executors: str = "threads") -> MemoryModel:
    memory = MemorySettings(compensator=compensator, executors=executors)
    return MemoryModel(StageGeometry.from_profile(MNISTNET, plan.partition), MNISTNET, memory)


@pytest.mark.parametrize("compensator", COMPENSATOR_NAMES)
def test_one_worker_one_stage_counts_no_compensator_state(compensator: str) -> None:
    plan = make_plan(1, 1, num_units=len(MNISTNET.layers))
    breakdown = _model(plan, compensator).breakdown(plan.workers)
    assert not any(k in breakdown for k in KEYS)


@pytest.mark.parametrize("compensator", [c for c in COMPENSATOR_NAMES if c != "none"])
def test_state_is_counted_per_stale_stage(compensator: str) -> None:
    plan = make_plan(2, 1, num_units=len(MNISTNET.layers))  # bounds (1, 0): only stage 0 can be stale
    model = _model(plan, compensator)
    bounds = [staleness_bound(plan, j) for j in range(plan.num_stages)]
    assert bounds == [1, 0]
    w = model.geometry.weights
    breakdown = model.breakdown(plan.workers)
    assert breakdown.get("compensator_moments", 0) == COPIES.get(compensator, 0) * w[0] * 4
    # one float64 accumulator at stage 0, and Iter-Fisher's float64 λ where it keeps v_r and v_a
    assert breakdown["compensator_counters"] == 8 + 8 * (compensator in LAMBDA_TENSOR)
    ring = w[0] * 4 if compensator in ("iter-fisher", "iter-fisher-cf") else 0
    assert breakdown.get("compensator_ring", 0) == ring


@given(st.integers(1, 3), st.integers(1, 4), st.sampled_from(["iter-fisher", "dc-asgd-a", "gap-aware"]))
@settings(max_examples=25, deadline=None)
def test_state_follows_the_bounds(stages: int, workers: int, compensator: str) -> None:
    plan = make_plan(stages, workers, num_units=len(MNISTNET.layers))
    model = _model(plan, compensator)
    stale = [j for j in range(stages) if staleness_bound(plan, j) > 0]
    w = model.geometry.weights
    assert model.breakdown(plan.workers).get("compensator_moments", 0) == COPIES[compensator] * sum(
        w[j] for j in stale
    ) * 4


def test_executor_processes_share_the_moments_and_keep_statistics_per_live_worker() -> None:
    """The stage's executors share DC-ASGD-a's mean square (with its int64 count of gradients, once per stage:
    engine/processes/tuning.py); each keeps its own float64 correction accumulator."""
    plan = make_plan(2, 2, num_units=len(MNISTNET.layers))
    threads = _model(plan, "dc-asgd-a").breakdown(plan.workers)
    processes = _model(plan, "dc-asgd-a", executors="processes").breakdown(plan.workers)
    stale = sum(staleness_bound(plan, j) > 0 for j in range(plan.num_stages))
    assert processes["compensator_moments"] == threads["compensator_moments"] + stale * 8
    assert processes["compensator_counters"] == 2 * threads["compensator_counters"]


@pytest.mark.parametrize("compensator", ["gap-aware", "iter-fisher", "iter-fisher-lean", "dc-asgd-a"])
def test_the_engine_allocates_state_only_at_stale_stages(compensator: str) -> None:
    plan = make_plan(3, 1)  # bounds (2, 1, 0)
    engine, result = run_plan(
        plan, stream(30), compensator=compensator, compensator_settings=CompensatorSettings(eta_lambda=1e-3)
    )
    per_stage = [sum(t.numel() for t in c.state_tensors()) for c in engine.pipeline.compensators]
    assert per_stage[2] == 0 and per_stage[0] > 0 and per_stage[1] > 0
    assert result.max_staleness[2] == 0


@pytest.mark.parametrize("compensator", [c for c in COMPENSATOR_NAMES if c != "none"])
@pytest.mark.parametrize("eta_lambda", [1e-3, 0.0])
def test_the_counted_state_is_what_the_compensator_allocates(compensator: str, eta_lambda: float) -> None:
    """A stale stage's compensator after stale calls holds, besides its ring, exactly the model's
    ``compensator_moments`` + ``compensator_counters`` bytes (moments, the float64 accumulator, Iter-Fisher's
    float64 λ); ``step-aware`` allocates no accumulator and is over-counted by its 8 bytes."""
    plan = make_plan(2, 1, num_units=len(MNISTNET.layers))  # only stage 0 can be stale
    memory = MemorySettings(compensator=compensator, lambda_tuning=eta_lambda > 0)
    model = MemoryModel(StageGeometry.from_profile(MNISTNET, plan.partition), MNISTNET, memory)
    breakdown = model.breakdown(plan.workers)
    params = [torch.zeros(model.geometry.weights[0])]
    made = make_compensator(compensator, params, CompensatorSettings(eta_lambda=eta_lambda), 1)
    for _ in range(2):  # stale calls with a delta in the ring (state is allocated at first use)
        if made.needs_deltas:
            made.observe_update([torch.full_like(params[0], 1e-3)])
        made.compensate([torch.ones_like(params[0])], staleness=1, theta_then=params, theta_now=params)
    ring = getattr(made, "_ring", None)
    in_ring = {ptr for ptr, _ in ring.storages()} if ring is not None else set()
    held = sum(nbytes for ptr, nbytes in dict(made.state_storages()).items() if ptr not in in_ring)
    counted = breakdown.get("compensator_moments", 0) + breakdown.get("compensator_counters", 0)
    assert held == (counted - 8 if compensator == "step-aware" else counted)
