"""The admission queue's inputs in the plan's bytes, ties in R_F broken toward less
memory, and one unsplit worker when it keeps up with the stream (docs/planner.md readings 6, 10)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.errors import ConfigError, InfeasibleBudgetError
from ferret_core.planning.admission_queue import AdmissionQueue, max_wait, queue_bytes, queue_slots
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings
from ferret_core.planning.residency import LABEL_BYTES
from ferret_core.profile import LayerProfile, ModelProfile

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"
QUEUE = AdmissionQueue(delivery_s=0.1, delivery_items=256)  # the trainer's D and B

unit = st.tuples(st.floats(0.05, 5.0), st.floats(0.05, 10.0), st.integers(1, 200_000), st.integers(1, 20_000))


def _profile(units: list[tuple[float, float, int, int]], inputs: int) -> ModelProfile:
    layers = tuple(LayerProfile(f"u{i}", tf, tb, w, a) for i, (tf, tb, w, a) in enumerate(units))
    return ModelProfile("random", (inputs,), layers)


def _planners(profile: ModelProfile, interval: float, decay: float | None = None) -> tuple[Planner, Planner]:
    """The same planner without and with the admission queue."""
    plain = PlannerSettings(arrival_interval=interval, decay=decay, memory=MemorySettings(compensator="none"))
    queued = PlannerSettings(
        arrival_interval=interval, decay=decay, memory=MemorySettings(compensator="none", admission_queue=QUEUE)
    )
    return Planner(profile, plain), Planner(profile, queued)


@pytest.mark.parametrize("name", ["mnistnet", "mlp", "mlp-digits", "convnet"])
@pytest.mark.parametrize("multiple", [4.0, 1.0, 0.3])
def test_the_queue_adds_exactly_its_bytes(name: str, multiple: float) -> None:
    profile = ModelProfile.load(PROFILES / f"{name}.json")
    interval = multiple * profile.sequential_time
    without, with_queue = _planners(profile, interval)
    plan = without.plan(None)
    # the same configuration, priced with the queue: exactly K × (input + label) bytes per live worker more
    model = MemoryModel.for_plan(plan, profile, with_queue.settings.memory)
    slots = queue_slots(max_wait(plan.decay), 0.1, interval, plan.num_workers, 256)
    extra = queue_bytes(slots, plan.live_workers, profile.input_elements, 4, LABEL_BYTES)
    assert model.total(plan.workers) - plan.planned_bytes == extra
    assert model.breakdown(plan.workers)["admission_queue"] == extra
    assert sum(model.breakdown(plan.workers).values()) == model.total(plan.workers)
    queued = with_queue.plan(None)
    if queued.workers == plan.workers and queued.partition == plan.partition:  # same choice: same difference
        assert queued.planned_bytes == plan.planned_bytes + extra
        assert queued.memory_breakdown["admission_queue"] == extra


def test_a_budget_that_fits_only_without_the_queue() -> None:
    """The budget covers the queue: what fits without it is refused, or planned smaller, with it."""
    profile = ModelProfile.load(PROFILES / "mnistnet.json")
    interval = 0.25 * profile.sequential_time  # several workers
    without, with_queue = _planners(profile, interval)
    top = without.plan(None)
    assert top.live_workers > 1
    fitted = with_queue.plan(top.planned_bytes)  # fits without the queue exactly
    assert fitted.planned_bytes <= top.planned_bytes
    assert fitted.live_workers < top.live_workers or fitted.adaptation_rate < top.adaptation_rate
    # the smallest plan without the queue does not fit at all with it
    with pytest.raises(InfeasibleBudgetError) as refused:
        with_queue.plan(without.min_feasible_bytes)
    assert refused.value.min_feasible_bytes > without.min_feasible_bytes


@settings(max_examples=60, deadline=None)
@given(st.lists(unit, min_size=1, max_size=5), st.integers(1, 3000), st.floats(0.3, 3.0), st.sampled_from([0.0, 0.1]))
def test_queue_bytes_are_per_live_worker(
    units: list[tuple[float, float, int, int]], inputs: int, multiple: float, decay: float
) -> None:
    profile = _profile(units, inputs)
    without, with_queue = _planners(profile, multiple * profile.max_forward_time, decay)
    plan = with_queue.plan(None)
    for budget in (None, (plan.planned_bytes + with_queue.min_feasible_bytes) // 2, with_queue.min_feasible_bytes):
        chosen = with_queue.plan(budget)
        bare = MemoryModel.for_plan(chosen, profile, without.settings.memory).total(chosen.workers)
        slots = queue_slots(max_wait(chosen.decay), 0.1, chosen.arrival_interval, chosen.num_workers, 256)
        per_item = (inputs + -(-LABEL_BYTES // 4)) * 4
        assert chosen.planned_bytes - bare == slots * chosen.live_workers * per_item


def test_the_queue_needs_its_wait_resolved() -> None:
    profile = ModelProfile.load(PROFILES / "mlp.json")
    plan = Planner(profile, PlannerSettings(arrival_interval=1.0)).plan(None)

    geometry = StageGeometry.from_profile(profile, plan.partition)
    with pytest.raises(ConfigError, match="its W resolved"):
        MemoryModel(geometry, profile, MemorySettings(admission_queue=QUEUE), arrival_interval=1.0, num_slots=1)
    with pytest.raises(ConfigError):
        AdmissionQueue(delivery_s=-1.0, delivery_items=1)


@pytest.mark.parametrize("name", ["mnistnet", "mlp", "mlp-digits", "convnet", "resnet18-32", "mobilenet-32"])
@pytest.mark.parametrize("multiple", [1.0, 1.5, 4.0, 100.0])
def test_one_unsplit_worker_when_it_keeps_up(name: str, multiple: float) -> None:
    """t^d ≥ Σ(t̂^f + t̂^b): the plan is one stage × one worker, every item trained."""
    profile = ModelProfile.load(PROFILES / f"{name}.json")
    planner = Planner(profile, PlannerSettings(arrival_interval=multiple * profile.sequential_time))
    assert planner.stream_bound
    plan = planner.plan(None)
    assert (plan.num_stages, plan.num_workers, plan.live_workers) == (1, 1, 1)
    assert not any(w.recompute or any(w.omission) for w in plan.workers)


def test_a_stream_faster_than_one_worker_still_splits() -> None:
    profile = ModelProfile.load(PROFILES / "mnistnet.json")
    planner = Planner(profile, PlannerSettings(arrival_interval=0.25 * profile.sequential_time))
    assert not planner.stream_bound
    plan = planner.plan(None)
    assert plan.live_workers * plan.num_stages > 1


def _key(option_rank: tuple[float, ...]) -> tuple[float, ...]:
    return option_rank[:2]  # (stream tier, R_F): what must tie


@settings(max_examples=80, deadline=None)
@given(
    st.lists(unit, min_size=1, max_size=5),
    st.floats(0.3, 6.0),
    st.sampled_from([0.0, 0.01, 0.1]),
    st.floats(0.0, 1.2),
    st.booleans(),
)
def test_equal_rate_means_least_bytes(
    units: list[tuple[float, float, int, int]], multiple: float, decay: float, fraction: float, slow: bool
) -> None:
    """Among the configurations that tie with the chosen one (same R_F; or, when one unsplit worker keeps
    up, all that train every item), the chosen plan has the fewest bytes; at a slow stream it is 1 × 1."""
    profile = _profile(units, 100)
    interval = (1.0 + multiple if slow else multiple) * (profile.sequential_time if slow else profile.max_forward_time)
    planner = Planner(profile, PlannerSettings(arrival_interval=interval, decay=decay))
    top = planner.plan(None).planned_bytes
    budget = int(planner.min_feasible_bytes + fraction * (top - planner.min_feasible_bytes))
    plan = planner.plan(budget)
    options = planner.options(budget)
    best = min(options, key=planner.rank)
    assert plan.planned_bytes == best.bytes
    tied = [o for o in options if _key(planner.rank(o)) == _key(planner.rank(best))]
    assert plan.planned_bytes == min(o.bytes for o in tied)
    if slow and budget >= top:  # unconstrained at a stream one worker keeps up with
        assert planner.stream_bound
        assert (plan.num_stages, plan.live_workers) == (1, 1)
