"""Memory is measured from what the engine holds, independently of the plan's prediction (DESIGN §3.8)."""

from __future__ import annotations

import torch
from torch import nn

from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from ferret_core.engine.memory_meter import MemoryMeter, SavedTensorTracker, storage_bytes, storage_keys
from ferret_core.engine.stage_exec import backward, build_stages, forward_with_grad
from ferret_core.plan import Partition
from tests.unit.test_engine_support import make_plan, run_plan, stream, tiny_units, uniform_times


def test_storages_are_counted_once() -> None:
    base = torch.zeros(100)
    view = base[10:20]
    assert storage_bytes([base, view, base.view(10, 10)]) == 400
    meter = MemoryMeter({"a": lambda: storage_keys([base]), "b": lambda: storage_keys([view, torch.ones(5)])})
    assert meter.sample() == 420 and meter.peak_breakdown == {"a": 400, "b": 20, "autograd_saved": 0}


def test_excluded_storages_are_never_counted_whoever_holds_them() -> None:
    """What another meter counts (an executor's view of the shared slots) is left out of every source, of
    autograd's saved tensors and of the full walk; the rest is counted as before."""
    shared = torch.ones(50, requires_grad=True)
    own = torch.ones(5)
    meter = MemoryMeter(
        {"a": lambda: storage_keys([shared.detach(), own])}, exclude=storage_keys([shared]), cuda=False
    )
    with meter.tracker.hooks():
        loss = (shared * 2.0).sum()  # saves nothing of its own but the shared weight's storage
        out = shared * torch.full((50,), 3.0)  # saves the shared weight and a private tensor
    assert meter.sample() == 20 + 200 == meter.walk()  # own, and the private saved tensor
    assert meter.last_breakdown == {"a": 20, "autograd_saved": 200}
    del loss, out


def test_saved_tensors_are_tracked_while_their_graph_lives() -> None:
    programs, (version,) = build_stages(tiny_units(), Partition((0, 3)))
    tracker = SavedTensorTracker()
    with tracker.hooks():
        graph = forward_with_grad(programs[0].runner(), version, torch.randn(1, 6), input_grad=False)
    saved = tracker.live()
    assert saved and all(nbytes > 0 for _, nbytes in saved)
    backward(graph, target=torch.tensor([1]))
    del graph, saved
    assert tracker.live() == []


def test_one_extra_stash_raises_the_measured_peak_by_its_bytes_and_not_the_prediction() -> None:
    units, items = tiny_units(), stream(30)
    plan = make_plan(3, 2)

    def run(extra: bool) -> tuple[int, int]:
        setup = FerretPolicy(plan).setup("tiny", len(units), 1.0)
        engine = StreamEngine(units, setup, EngineSettings())
        assert engine.pipeline.meter is not None
        if extra:
            stash = engine.pipeline.store.master(1).clone()
            engine.pipeline.meter.add_source("extra_stash", lambda: stash.storages)
        result = engine.run_virtual(items, uniform_times(3), 1.0)
        assert result.peak_bytes is not None and result.planned_bytes is not None
        return result.peak_bytes, result.planned_bytes

    (peak, planned), (peak_extra, planned_extra) = run(False), run(True)
    version_bytes = storage_bytes(build_stages(units, plan.partition)[1][1].tensors())
    assert peak_extra - peak == version_bytes
    assert planned_extra == planned == plan.planned_bytes


def test_recomputation_lowers_the_measured_peak_for_wide_activations() -> None:
    torch.manual_seed(0)
    units: list[nn.Module] = [nn.Sequential(nn.Linear(6, 2048), nn.ReLU(), nn.Linear(2048, 64), nn.ReLU())
                              for _ in range(1)]
    units += [nn.Sequential(nn.Linear(64, 4))]
    items = stream(24)
    peaks = {}
    for recompute in (False, True):
        plan = make_plan(2, 2, num_units=2, recompute=recompute)
        _, r = run_plan(plan, items, units=units, arrival=2.0)
        assert r.peak_bytes is not None
        peaks[recompute] = r.peak_bytes
    assert peaks[True] < peaks[False]


def test_stashes_are_freed_when_no_item_references_them() -> None:
    plan = make_plan(3, 2)
    engine, result = run_plan(plan, stream(30))
    p = engine.pipeline
    assert p.in_flight() == 0
    assert list(p.sources.stashes()) == []
    assert p.meter is not None and p.meter.sample() <= result.peak_bytes  # type: ignore[operator]


def test_the_meter_counts_queued_items_as_the_plan_does() -> None:
    """Items admitted but not started (the wall clock's admission queue) hold their input and label: the
    measured bytes grow by exactly the planner's queue term per item, K × (input + label)."""
    from ferret_core.planning.residency import LABEL_BYTES
    from tests.unit.test_engine_support import IN_FEATURES

    plan = make_plan(1, 1)
    setup = FerretPolicy(plan).setup("tiny", 1, 1.0)
    engine = StreamEngine(tiny_units(num_units=1), setup, EngineSettings(keep_trace=False, validate=False))
    pipeline = engine.pipeline
    assert pipeline.meter is not None
    before = pipeline.meter.sample()
    queued = 7
    with pipeline.lock:
        for index, item in enumerate(stream(queued)):
            assert pipeline.dispatch(index, item.x, item.y, 0, admit=lambda worker: True) is None
    assert pipeline.scheduler.waiting(0) == queued  # nothing ran: all wait for the first stage
    per_item = IN_FEATURES * 4 + LABEL_BYTES  # the planner's (input + label) elements × 4 bytes
    assert pipeline.meter.sample() - before == queued * per_item
