"""Snapshots carry the compensators' state (DESIGN §4): λ, v_r, v_a and the delta ring come back exactly
through the snapshot codec (``torch.load(weights_only=True)``, never pickle), and a re-plan keeps what the
new plan can use. The learner here is the trainer's own ``EngineLearner`` on the digits MLP."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from ferret_core.data import dataset_spec
from services.config import load_settings
from services.kafka.record_codec import SampleDecoder
from services.snapshots import SnapshotPayload
from services.snapshots.codec import decode_tensors, encode_tensors
from services.trainer.checkpoints import decode_compensator, encode_compensator
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import TrainerParts, assemble, build_zoo_model
from tests.unit.test_engine_support import make_plan

# Iter-Fisher (Algorithm 1) explicitly: these tests round-trip its delta ring (the default is iter-fisher-lean)
SETTINGS = load_settings(
    None,
    env={
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_COMPENSATOR": "iter-fisher",
    },
)


def trained_learner(stages: int = 2, workers: int = 2, items: int = 60) -> EngineLearner:
    model = build_zoo_model(SETTINGS)
    learner = EngineLearner(model, make_plan(stages, workers, num_units=model.num_units), SETTINGS)
    gen = torch.Generator().manual_seed(0)
    for i in range(items):
        learner.arrive(i, torch.rand(1, 8, 8, generator=gen), i % 10)
    learner.drain(60)
    return learner


def parts_of(learner: EngineLearner) -> TrainerParts:
    return assemble(SETTINGS, learner, SampleDecoder(*dataset_spec("digits")), None)


@pytest.fixture
def learners() -> Iterator[list[EngineLearner]]:
    made: list[EngineLearner] = []
    yield made
    for learner in made:
        learner.close()


def assert_same(a: Any, b: Any) -> None:
    """Equal structure, equal scalars, bit-identical tensors."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype
        assert_close(a, b, rtol=0.0, atol=0.0)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same(x, y)
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b)
    else:
        assert a == b


def test_the_compensator_codec_round_trips_through_the_snapshot_codec() -> None:
    states = [
        {"name": "iter-fisher", "lambda": 0.1999999959970295, "v_r": [torch.randn(3, 2)], "nan": math.nan,
         "ring": {"capacity": 2, "pushed": 5, "deltas": [[torch.randn(3, 2)], [torch.randn(3, 2)]]}, "v_a": None},
        {"name": "iter-fisher", "lambda": 0.2, "v_r": [], "ring": {"capacity": 0, "pushed": 0, "deltas": []}},
    ]  # fmt: skip
    tensors, document = encode_compensator(states)
    assert all(name.startswith("compensator.") for name in tensors)
    loaded = decode_tensors(encode_tensors(tensors))  # weights_only=True: tensors only, no pickle
    assert_same(states, decode_compensator(document, loaded))
    assert encode_compensator([]) == ({}, {})


def test_a_snapshot_restores_lambda_moments_and_ring_exactly(learners: list[EngineLearner]) -> None:
    first = trained_learner()
    learners.append(first)
    saved = first.compensator_state()
    assert saved[0]["lambda"] != 0.2 and saved[0]["v_r"] is not None  # λ moved: a reset would show
    assert any(len(state["ring"]["deltas"]) > 0 for state in saved)
    payload = parts_of(first).checkpoints.payload({})
    assert payload.compensator and any(name.startswith("compensator.") for name in payload.tensors)
    stored = SnapshotPayload(
        tensors=decode_tensors(encode_tensors(payload.tensors)),  # as the store writes and reads them
        plan=payload.plan,
        offsets=payload.offsets,
        counters=payload.counters,
        compensator=payload.compensator,
        meta=payload.meta,
    )
    second = EngineLearner(build_zoo_model(SETTINGS), first.plan, SETTINGS)
    learners.append(second)
    parts_of(second).checkpoints.apply(stored)
    assert_same(saved, second.compensator_state())  # λ, v_r, v_a, the ring (oldest first), statistics


def test_a_snapshot_of_another_compensator_leaves_the_compensators_fresh(
    learners: list[EngineLearner], caplog: pytest.LogCaptureFixture
) -> None:
    first = trained_learner()
    learners.append(first)
    payload = parts_of(first).checkpoints.payload({})
    env = {"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp", "FERRET_TRAINER_COMPENSATOR": "gap-aware"}
    settings = load_settings(None, env=env)
    second = EngineLearner(build_zoo_model(settings), first.plan, settings)
    learners.append(second)
    fresh = second.compensator_state()
    parts = assemble(settings, second, SampleDecoder(*dataset_spec("digits")), None)
    parts.checkpoints.apply(payload)
    assert "compensator state not restored" in caplog.text
    assert_same(fresh, second.compensator_state())


def test_a_replan_keeps_lambda_and_moments_and_restarts_the_ring(learners: list[EngineLearner]) -> None:
    # workers 3 → 2 → 2: every stage of every plan can be stale, so every stage keeps v_r, v_a (one worker's
    # last stage, never stale, keeps none: tests/unit/test_memory_compensator_state.py)
    learner = trained_learner(stages=2, workers=3)
    learners.append(learner)
    before = learner.compensator_state()
    learner.apply_plan(make_plan(2, 2, num_units=learner.model.num_units))  # same stages, one worker fewer
    after = learner.compensator_state()
    for old, new in zip(before, after, strict=True):
        assert new["lambda"] == old["lambda"]
        assert_same(old["v_r"], new["v_r"])
        assert_same(old["v_a"], new["v_a"])
        assert new["ring"]["deltas"] == []  # docs/service.md: no later gradient reads a pre-drain delta
    learner.apply_plan(make_plan(1, 2, num_units=learner.model.num_units))  # the stages merge
    [merged] = learner.compensator_state()
    assert_same([t for s in before for t in s["v_r"]], merged["v_r"])  # every parameter keeps its moments
    assert min(s["lambda"] for s in before) <= merged["lambda"] <= max(s["lambda"] for s in before)
