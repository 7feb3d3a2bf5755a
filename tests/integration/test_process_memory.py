"""What a process plan holds, measured, within what the byte model plans (``MemorySettings(executors=
"processes")``): the shared version slots, delta rings and average steps (counted once) plus every
executor's measured peak inside its own process (:meth:`ProcessClock.measured_bytes`), for 1 × 1, 2 × 1,
1 × 2, T1 and T2 plans and the compensators that share state per stage; the executors' part is real
(above the parameters of the stages they run once items are in flight, more with more items in flight)
and excludes the shared segments.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.plan import Plan, WorkerConfig
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.profiler import profile_model
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.schedule.scheduler import PlanRules
from ferret_core.zoo.base import ZooModel
from tests.unit.test_engine_support import Item
from tests.unit.test_memory_bound import CLASSES, conv_units, make_items, plan_of, sized_profile, wide_units

pytestmark = pytest.mark.integration

WIDTHS = [48, 96, 48]  # 4 units; activations per item are small beside the weights (a gradient is |w_j|)
ITEMS = 24


def _units_and_profile(model: str = "mlp") -> tuple[list[nn.Module], ModelProfile]:
    """The MLP (weights outweigh one item's activations) or an activation-heavy CNN on 3×24×24 (its
    activations outweigh its weights ~10×: sends and queued inputs matter), 4 units each."""
    if model == "mlp":
        units = wide_units(WIDTHS, 0)
        return units, sized_profile(units, [(1.0, 2.0)] * len(units))
    units, shape = conv_units()
    sized = profile_model(ZooModel("cnn", tuple(units), shape, CLASSES), warmup=0, repeats=1)
    layers = tuple(
        LayerProfile(lp.name, 1.0, 2.0, lp.params, lp.activations, lp.saved, lp.saved_input, lp.saved_output)
        for lp in sized.layers
    )
    return units, ModelProfile("cnn", shape, layers)


def _items(profile: ModelProfile) -> list[Item]:
    if profile.model == "tiny":
        return make_items(ITEMS, 1)
    gen = torch.Generator().manual_seed(1)
    shape = profile.input_shape
    return [
        Item(torch.rand(shape, generator=gen), int(torch.randint(0, CLASSES, (), generator=gen))) for _ in range(ITEMS)
    ]


def _workers(
    n: int, stages: int, *, recompute: bool = False, accumulation: int = 1, omission: tuple[int, ...] | None = None
) -> list[WorkerConfig]:
    omitted = omission or (0,) * stages
    return [WorkerConfig(i, True, recompute, (accumulation,) * stages, omitted) for i in range(n)]


PLANS = {  # name: (model, stage boundaries over its 4 units, workers, compensator)
    "1x1": ("mlp", (0, 4), _workers(1, 1), "none"),
    "2x1": ("mlp", (0, 4), _workers(2, 1), "none"),
    "1x2": ("mlp", (0, 2, 4), _workers(1, 2), "none"),
    "1x2-T1": ("mlp", (0, 2, 4), _workers(1, 2, recompute=True), "none"),
    "2x1-T2-iter-fisher": ("mlp", (0, 4), _workers(2, 1, accumulation=2), "iter-fisher"),
    "2x2-iter-fisher-lean": ("mlp", (0, 2, 4), _workers(2, 2), "iter-fisher-lean"),
    "2x2-gap-aware": ("mlp", (0, 2, 4), _workers(2, 2), "gap-aware"),  # its C shared per stage, counted once
    "2x1-dc-asgd-a": ("mlp", (0, 4), _workers(2, 1), "dc-asgd-a"),  # its mean square shared per stage, once
    "cnn-1x3": ("cnn", (0, 1, 2, 4), _workers(1, 3), "none"),
    # T3: stage 0 forwards items it does not back-propagate; their sends were once held forever
    "cnn-1x3-T3": ("cnn", (0, 1, 2, 4), _workers(1, 3, omission=(2, 1, 0)), "none"),
    "cnn-1x3-T1-T3": ("cnn", (0, 1, 2, 4), _workers(1, 3, recompute=True, omission=(2, 2, 0)), "none"),
}


def _setup(plan: Plan) -> PolicySetup:
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


def _run(
    plan: Plan, units: list[nn.Module], items: list[Item], compensator: str, *, burst: bool
) -> tuple[int, dict, int, dict]:  # type: ignore[type-arg]
    """Train ``items`` on process executors, all submitted at once (``burst``: items queue and overlap in
    the pipeline) or one at a time; returns the measured bytes, the executors' peaks, the shared bytes and
    each executor's breakdown at its peak."""
    settings = ProcessSettings(lr=0.01, compensator=compensator, keep_trace=False, queue_slots=ITEMS)
    with ProcessClock(units, _setup(plan), settings) as clock:
        if burst:
            clock.submit_many([i.x for i in items], [i.y for i in items])
            clock.drain(timeout=60)
        else:
            for item in items:
                clock.submit(item.x, item.y)
                clock.drain(timeout=30)
        assert clock.counters.trained_any_stage == ITEMS
        usage = {(u.worker, u.stage): u for u in clock.usage()}
        peaks = clock.executor_bytes()
        assert peaks == {e: u.measured_bytes for e, u in usage.items()}  # the answers carried the peaks
        assert all(u.memory_samples > u.actions > 0 for u in usage.values())  # after every F and B (and at start)
        return clock.measured_bytes(), peaks, clock.shared_bytes(), {e: u.measured_breakdown for e, u in usage.items()}


@pytest.mark.parametrize("name", list(PLANS))
def test_measured_shared_and_executor_bytes_stay_within_the_planned_bytes(name: str) -> None:
    kind, bounds, workers, compensator = PLANS[name]
    units, profile = _units_and_profile(kind)
    plan = plan_of(bounds, workers, 1.0)
    model = MemoryModel.for_plan(plan, profile, MemorySettings(executors="processes", compensator=compensator))
    planned = model.total(plan.workers)
    measured, peaks, shared, breakdowns = _run(plan, units, _items(profile), compensator, burst=True)
    assert measured == shared + sum(peaks.values())
    assert measured <= planned, (name, measured, planned, model.breakdown(plan.workers), breakdowns)
    assert set(peaks) == {(w.index, j) for w in workers for j in range(plan.num_stages)}
    weights = StageGeometry.from_profile(profile, plan.partition).weights
    for (n, j), peak in peaks.items():
        held = breakdowns[(n, j)]
        assert peak >= weights[j] * 4, (name, (n, j), held)  # a B's sample holds the stage's gradient, |w_j|
        if kind == "mlp":  # at the peak: the gradient (the sum of c^a of them under T2)
            assert held["gradients"] == weights[j] * 4, (name, (n, j), held)
            # the shared slots are not counted here: the weights autograd saved are theirs
            assert held["autograd_saved"] < weights[j] * 4
        if plan.num_stages - j > 1:  # up to P − j items in flight here: another item's activations besides
            assert peak > weights[j] * 4, (name, (n, j), held)
    if name in ("1x1", "2x1"):  # one item at a time per executor, no compensator: the gradient alone
        assert all(peak == weights[0] * 4 for peak in peaks.values()), peaks


def test_more_items_in_flight_hold_more_bytes() -> None:
    """Stage 0 of a 1 × 2 plan may hold two items in flight (P − j): submitted at once it holds the
    second item's activations next to the first item's gradient; one at a time it never does."""
    _, bounds, workers, compensator = PLANS["1x2"]
    units, profile = _units_and_profile()
    plan = plan_of(bounds, workers, 1.0)
    items = _items(profile)
    _, one_at_a_time, _, alone = _run(plan, units, items, compensator, burst=False)
    _, overlapped, _, together = _run(plan, units, items, compensator, burst=True)
    w0 = StageGeometry.from_profile(profile, plan.partition).weights[0] * 4
    assert alone[(0, 0)]["gradients"] == w0 and one_at_a_time[(0, 0)] < w0 + 4 * WIDTHS[1]
    held = together[(0, 0)]["items"] + together[(0, 0)]["autograd_saved"] + together[(0, 0)]["sends"]
    assert together[(0, 0)]["gradients"] == w0 and held >= 4 * WIDTHS[1]  # at least the next item's output
    assert overlapped[(0, 0)] > one_at_a_time[(0, 0)]
