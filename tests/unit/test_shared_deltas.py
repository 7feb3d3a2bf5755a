"""The delta ring over pre-allocated slots and shared counters (:class:`DeltaRing` with ``slots`` and
``counters``; :class:`~ferret_core.engine.processes.deltas.SharedDeltas` in shared memory): the same
invariant as the ring that owns its slots, one ring however many objects are built over the same memory,
and the compensators that may (and may not) walk it. A reader in another process: the integration tier
(tests/integration/test_process_executors.py)."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from ferret_core.compensation import CompensatorSettings, DeltaRing, make_compensator
from ferret_core.compensation.ring import COUNTERS
from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.settings import ProcessSettings, check_supported, shares_deltas
from ferret_core.errors import ConfigError
from ferret_core.schedule.scheduler import PlanRules
from tests.unit.test_engine_support import make_plan

SHAPES = [(2, 3), (3,)]
PARAMS = [torch.zeros(s) for s in SHAPES]


def _delta(value: float) -> list[Tensor]:
    return [torch.full(s, value) for s in SHAPES]


def _values(deltas: list[list[Tensor]]) -> list[float]:
    return [float(d[0].flatten()[0]) for d in deltas]


def _over(capacity: int) -> tuple[DeltaRing, list[list[Tensor]], Tensor]:
    slots = [[torch.zeros(s) for s in SHAPES] for _ in range(capacity)]
    counters = torch.zeros(COUNTERS, dtype=torch.int64)
    return DeltaRing(capacity, slots=slots, counters=counters), slots, counters


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 5), st.lists(st.floats(-4, 4, allow_nan=False, width=32), max_size=14))
def test_after_n_pushes_it_holds_the_last_min_n_capacity_in_push_order(capacity: int, values: list[float]) -> None:
    shared, _, _ = _over(capacity)
    own = DeltaRing(capacity)  # the ring that owns its slots: the reference
    for k, v in enumerate(values):
        if k % 2:  # both ways of pushing store the same delta
            shared.push_difference(_delta(v), _delta(0.0))
        else:
            shared.push(_delta(v))
        own.push(_delta(v))
        assert len(shared) == min(k + 1, capacity) and shared.pushed == k + 1
    assert _values(shared.recent(capacity)) == values[-capacity:] if values else shared.recent(capacity) == []
    for count in range(capacity + 2):
        assert _values(shared.recent(count)) == _values(own.recent(count))


def test_two_rings_over_the_same_memory_are_one_ring() -> None:
    writer, slots, counters = _over(3)
    reader = DeltaRing(3, slots=slots, counters=counters)
    for v in range(1, 6):
        writer.push(_delta(float(v)))
    assert reader.pushed == 5 and len(reader) == 3
    assert _values(reader.recent(3)) == [3.0, 4.0, 5.0]
    storages = {t.untyped_storage().data_ptr() for t in writer.state_tensors()}
    assert {t.untyped_storage().data_ptr() for s in slots for t in s} == storages  # written in place, never moved


def test_push_difference_is_new_minus_old_to_the_bit() -> None:
    ring, _, _ = _over(2)
    gen = torch.Generator().manual_seed(0)
    new = [torch.randn(s, generator=gen) for s in SHAPES]
    old = [torch.randn(s, generator=gen) for s in SHAPES]
    for _ in range(3):  # the first fill and an overwrite
        ring.push_difference(new, old)
    for got, n, o in zip(ring.recent(1)[0], new, old, strict=True):
        assert torch.equal(got, n - o)


def test_a_ring_over_given_slots_cannot_grow_or_refit() -> None:
    ring, _, _ = _over(2)
    ring.grow(2)  # not larger: nothing to do
    with pytest.raises(ConfigError, match="cannot grow to 3"):
        ring.grow(3)
    with pytest.raises(ConfigError, match="keeps its capacity 2"):
        ring.refit(3, 3)


def test_bad_storage_is_refused_with_what_was_expected() -> None:
    with pytest.raises(ConfigError, match="needs 2 pre-allocated slots, got 1"):
        DeltaRing(2, slots=[[torch.zeros(1)]], counters=torch.zeros(COUNTERS, dtype=torch.int64))
    with pytest.raises(ConfigError, match="both its slots and its counters"):
        DeltaRing(1, slots=[[torch.zeros(1)]])
    with pytest.raises(ConfigError, match="int64 tensor of shape"):
        DeltaRing(1, slots=[[torch.zeros(1)]], counters=torch.zeros(COUNTERS))
    with pytest.raises(ConfigError, match="needs none"):
        SharedDeltas(0, PARAMS, 0)


def test_a_snapshot_round_trips_into_given_slots() -> None:
    own = DeltaRing(3)
    for v in range(1, 6):
        own.push(_delta(float(v)))
    shared, slots, _ = _over(3)
    storages = [t.untyped_storage().data_ptr() for s in slots for t in s]
    shared.load_state_dict(own.state_dict(), shapes=SHAPES, dtypes=[torch.float32] * 2, device=torch.device("cpu"))
    assert [t.untyped_storage().data_ptr() for s in slots for t in s] == storages  # copied in, not replaced
    own.push(_delta(6.0))
    shared.push(_delta(6.0))
    assert _values(shared.recent(3)) == _values(own.recent(3)) == [4.0, 5.0, 6.0]
    assert shared.pushed == own.pushed == 6


def test_shared_deltas_pickle_to_the_same_memory() -> None:
    store = SharedDeltas(0, PARAMS, 2)
    assert store.counters.is_shared()
    copy = pickle.loads(pickle.dumps(store))  # in one process: the same tensors' storage is copied, so only
    copy.ring().push(_delta(1.0))  # the layout is checked here; the cross-process test is in the integration tier
    assert copy.pushed == 1 and copy.capacity == 2 and len(copy.ring().recent(2)) == 1
    assert store.nbytes() == 2 * (6 + 3) * 4 + COUNTERS * 8


def test_iter_fisher_walks_a_shared_ring_and_keeps_its_own_lambda() -> None:
    settings_ = CompensatorSettings()
    store = SharedDeltas(0, PARAMS, 2)
    a = make_compensator("iter-fisher", PARAMS, settings_, 2)
    b = make_compensator("iter-fisher", PARAMS, settings_, 2)
    a.share_ring(store.ring())
    b.share_ring(store.ring())
    store.ring().push(_delta(0.5))  # the updater pushes; neither compensator observes
    grads = _delta(1.0)
    theta = _delta(0.0)
    out = b.compensate(grads, staleness=1, theta_then=theta, theta_now=theta)
    assert float(out[0][0, 0]) == pytest.approx(1.0 + 0.2 * 1.0 * 0.5)  # g + λ·g⊙g⊙Δ_1 with Δ_1 from the ring
    assert a.stats()["calls"] == 0 and b.stats()["calls"] == 1  # λ, v_r, v_a and the counts are per object
    assert a.stats()["lambda"] == pytest.approx(0.2) and b.stats()["lambda"] != a.stats()["lambda"]


def test_a_compensator_shares_only_a_ring_of_its_size_before_its_first_update() -> None:
    store = SharedDeltas(0, PARAMS, 2)
    with pytest.raises(ConfigError, match="holds 2 deltas, this compensator was built for ring_capacity=3"):
        make_compensator("iter-fisher", PARAMS, CompensatorSettings(), 3).share_ring(store.ring())
    used = make_compensator("iter-fisher", PARAMS, CompensatorSettings(), 2)
    used.observe_update(_delta(1.0))
    with pytest.raises(ConfigError, match="before the first update"):
        used.share_ring(store.ring())
    with pytest.raises(NotImplementedError, match=r"gap-aware.*cannot walk a shared ring"):
        make_compensator("gap-aware", PARAMS, CompensatorSettings(), 2).share_ring(store.ring())
    make_compensator("iter-fisher-lean", PARAMS, CompensatorSettings(), 2).share_ring(store.ring())  # no ring: no-op


def _setup() -> PolicySetup:
    plan = make_plan(1, 2, num_units=3)
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


@pytest.mark.parametrize("name", ["iter-fisher", "iter-fisher-cf"])
def test_process_executors_run_the_compensators_that_walk_the_deltas(name: str) -> None:
    check_supported(_setup(), ProcessSettings(compensator=name))
    assert shares_deltas(ProcessSettings(compensator=name))


@pytest.mark.parametrize("name", ["none", "step-aware", "fisher", "iter-fisher-lean", "dc-asgd-a"])
def test_compensators_without_deltas_get_no_shared_ring(name: str) -> None:
    check_supported(_setup(), ProcessSettings(compensator=name))
    assert not shares_deltas(ProcessSettings(compensator=name))


def test_gap_aware_runs_on_a_shared_average_not_a_ring() -> None:
    check_supported(_setup(), ProcessSettings(compensator="gap-aware"))  # its C is shared (test_shared_average.py)
    assert not shares_deltas(ProcessSettings(compensator="gap-aware"))


def test_a_negative_count_of_recorded_compensations_is_refused() -> None:
    with pytest.raises(ConfigError, match="record_compensations must be >= 0"):
        check_supported(_setup(), ProcessSettings(record_compensations=-1))


def test_a_copy_of_a_ring_that_owns_its_storage_counts_on_its_own() -> None:
    ring = DeltaRing(2)
    ring.push(_delta(1.0))
    assert len(ring) == 1  # the counters' view is made (and must not travel with a copy)
    copy = pickle.loads(pickle.dumps(ring))
    copy.push(_delta(2.0))
    copy.push(_delta(3.0))
    assert (ring.pushed, len(ring)) == (1, 1) and (copy.pushed, len(copy)) == (3, 2)
    assert _values(copy.recent(2)) == [2.0, 3.0]
