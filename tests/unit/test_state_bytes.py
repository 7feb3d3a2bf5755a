"""Each OCL algorithm's and buffering method's own state: the bytes the engine's memory meter counts for it
equal the bytes the byte models plan for it (MemoryModel's replay_buffer / lwf_teacher / mas_importances
extras; buffering_bytes' window and Camel buffer terms), once its buffers are full."""

from __future__ import annotations

import pytest

from ferret_core.engine import EngineSettings, Oracle, StreamEngine
from ferret_core.engine.buffering import LABEL_BYTES, NN_BYTES, BufferingPolicy, BufferingSettings
from ferret_core.engine.memory_meter import storage_bytes
from ferret_core.ocl import AlgorithmSettings, make_algorithm
from ferret_core.ocl.planning import planning_memory
from ferret_core.plan import Partition
from ferret_core.planning.cost_model import StageGeometry
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.schedule.stage_times import StageTimes
from tests.unit.test_engine_support import IN_FEATURES, stream, tiny_units

SMALL = AlgorithmSettings(buffer_size=12, replay_batch=3, mir_candidates=6, lwf_every=8, mas_every=5)
PLANNED_KEYS = {"er": "replay_buffer", "mir": "replay_buffer", "lwf": "lwf_teacher", "mas": "mas_importances"}


def true_profile() -> ModelProfile:
    """The tiny units' real parameter counts (times do not matter here); batch times up to 20 items."""
    layers = tuple(
        LayerProfile(f"u{i}", 1.0, 2.0, sum(p.numel() for p in unit.parameters()), 8, saved=10,
                     batch_times=((4, 2.0, 4.0), (20, 4.0, 8.0)))
        for i, unit in enumerate(tiny_units())
    )
    return ModelProfile("tiny", (IN_FEATURES,), layers)


@pytest.mark.parametrize("name", sorted(PLANNED_KEYS))
def test_algorithm_state_measured_equals_planned(name: str) -> None:
    profile = true_profile()
    algorithm = make_algorithm(name, SMALL)
    units = tiny_units()
    engine = StreamEngine(units, Oracle().setup("tiny", len(units), 1.0), EngineSettings(), algorithm=algorithm)
    engine.run_virtual(stream(40), None, 1.0)  # > buffer_size items, past the first teacher/anchor refresh
    memory = planning_memory(MemorySettings(), algorithm.footprint, algorithm.steady_shape(1))
    geometry = StageGeometry.from_profile(profile, Partition((0, profile.num_units)))
    planned = MemoryModel(geometry, profile, memory).breakdown([])[PLANNED_KEYS[name]]
    measured = storage_bytes(engine.pipeline.algorithm.state_tensors())
    labels = SMALL.buffer_size * 8 if name in ("er", "mir") else 0  # int64 labels: not in the plan (< 1 % on images)
    assert measured == planned + labels


@pytest.mark.parametrize("method", ["random-n", "last-n", "camel"])
def test_buffering_state_measured_equals_planned(method: str) -> None:
    profile = true_profile()
    settings = BufferingSettings(batch=4, window=8, camel_buffer=6, camel_replay=2)
    policy = BufferingPolicy(method, settings, profile=profile)
    units = tiny_units()
    setup = policy.setup("tiny", len(units), 1.0)
    engine = StreamEngine(units, setup, EngineSettings())
    # arrivals every 0.1 time units against steps of 3+ units: the window fills between steps
    engine.run_virtual(stream(60), StageTimes.from_profile(profile, setup.plan.partition), 0.1)
    feeder = engine.pipeline.feeder
    assert feeder is not None
    for i, item in enumerate(stream(settings.window, seed=1)):  # a full window, as between two steps
        feeder.offer(1000 + i, item.x, int(item.y or 0))
    unit = 4
    planned = settings.window * IN_FEATURES * unit
    if method == "camel":
        planned += settings.camel_buffer * (IN_FEATURES * unit + LABEL_BYTES + NN_BYTES)
    assert storage_bytes(feeder.state_tensors()) == planned
