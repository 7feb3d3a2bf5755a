"""The cheap meter is exact: at every sample of random runs (T1–T4, every
compensator), the cached sample equals a full walk of every source and every saved tensor."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ferret_core.compensation import COMPENSATOR_NAMES, DeltaRing
from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from ferret_core.engine.memory_meter import MemoryMeter
from tests.unit.test_engine_support import make_plan, stream, tiny_units, uniform_times

runs = st.fixed_dictionaries(
    {
        "stages": st.integers(1, 3),
        "workers": st.integers(1, 3),
        "recompute": st.booleans(),
        "accumulation": st.integers(1, 3),
        "omission": st.integers(0, 1),
        "compensator": st.sampled_from(COMPENSATOR_NAMES),
        "arrival": st.sampled_from([0.5, 1.0, 2.0]),
    }
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs)
def test_every_cached_sample_equals_a_full_walk(c: dict) -> None:  # type: ignore[type-arg]
    p = c["stages"]
    plan = make_plan(p, c["workers"], num_units=3, recompute=c["recompute"], accumulation=c["accumulation"],
                     omission=c["omission"] if p > 1 else 0)
    units = tiny_units(num_units=3)
    setup = FerretPolicy(plan).setup("tiny", len(units), c["arrival"])
    engine = StreamEngine(units, setup, EngineSettings(compensator=c["compensator"], keep_trace=False,
                                                       validate=False))
    meter = engine.pipeline.meter
    assert isinstance(meter, MemoryMeter)
    cached = meter.sample
    pairs: list[tuple[int, int]] = []

    def checked() -> int:
        got = cached()
        pairs.append((got, meter.walk()))
        return got

    meter.sample = checked  # type: ignore[method-assign]
    engine.run_virtual(stream(30), uniform_times(p), c["arrival"])
    assert pairs and all(got == full for got, full in pairs)
    assert meter.peak_bytes == max(full for _, full in pairs)


def test_the_ring_caches_its_storage_keys_until_a_slot_moves() -> None:
    ring = DeltaRing(2)
    ring.push([torch.ones(3)])
    first = ring.storages()
    assert ring.storages() is first
    ring.push([torch.ones(3)])
    assert len(ring.storages()) == 2
    keys = ring.storages()
    ring.push([torch.zeros(3)])  # full: overwritten in place, same storages
    assert ring.storages() is keys


def test_in_place_updates_keep_the_stable_keys_and_every_sample_exact() -> None:
    """A 1 × 1 plan updates its master in place (plain SGD, no compensation): the meter keeps its cached
    stable keys across such an update (the same storages) and every sample still equals a full walk."""
    plan = make_plan(1, 1, num_units=3)
    units = tiny_units(num_units=3)
    engine = StreamEngine(
        units,
        FerretPolicy(plan).setup("tiny", len(units), 1.0),
        EngineSettings(compensator="none", keep_trace=False, validate=False),
    )
    meter = engine.pipeline.meter
    assert isinstance(meter, MemoryMeter)
    cached, invalidate = meter.sample, meter.invalidate
    pairs: list[tuple[int, int]] = []
    invalidations: list[int] = []

    def checked() -> int:
        got = cached()
        pairs.append((got, meter.walk()))
        return got

    meter.sample = checked  # type: ignore[method-assign]
    meter.invalidate = lambda: (invalidations.append(1), invalidate())[1]  # type: ignore[method-assign]
    engine.run_virtual(stream(30), uniform_times(1), 1.0)
    assert engine.pipeline.counters.in_place_updates > 0
    assert len(invalidations) < engine.pipeline.counters.in_place_updates  # kept across in-place updates
    assert pairs and all(got == full for got, full in pairs)
