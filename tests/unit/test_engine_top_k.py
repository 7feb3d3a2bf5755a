"""The master's top-k classes: ``Pipeline.predict_top_k`` against a plain softmax over the units run in
sequence, and the wall clock's :class:`Arrival` carrying them (``EngineSettings.top_k``), as the trainer
publishes them in every ``Prediction``."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from ferret_core.errors import ConfigError
from tests.unit.test_engine_support import CLASSES, IN_FEATURES, make_plan, stream, tiny_units


def engine(plan_stages: int = 2, k: int = 1, seed: int = 0) -> tuple[StreamEngine, list[nn.Module]]:
    units = tiny_units(seed=seed, num_units=plan_stages)
    reference = copy.deepcopy(units)
    setup = FerretPolicy(make_plan(plan_stages, 1)).setup("tiny", len(units), 1.0)
    return StreamEngine(units, setup, EngineSettings(top_k=k, keep_trace=False, validate=False)), reference


def reference_probabilities(units: list[nn.Module], x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = x.unsqueeze(0)
        for unit in units:
            out = unit(out)
    return torch.softmax(out[0].float(), dim=0)


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, CLASSES + 3), stages=st.integers(1, 3), seed=st.integers(0, 1000))
def test_top_k_is_the_softmax_of_the_sequential_model_most_probable_first(k: int, stages: int, seed: int) -> None:
    e, reference = engine(stages, seed=seed)
    x = torch.randn(IN_FEATURES, generator=torch.Generator().manual_seed(seed))
    top = e.pipeline.predict_top_k(x, k)
    probs = reference_probabilities(reference, x)
    assert len(top) == min(k, CLASSES)
    classes = [c for c, _ in top]
    assert len(set(classes)) == len(classes)
    assert_close(torch.tensor([p for _, p in top]), probs[classes])
    assert all(a[1] >= b[1] for a, b in itertools.pairwise(top))
    beaten = [p for c, p in enumerate(probs.tolist()) if c not in classes]
    assert all(top[-1][1] >= p for p in beaten)  # nothing left out beats the last one kept
    assert top[0] == e.pipeline.predict_with_confidence(x) and top[0][0] == int(probs.argmax())


def test_ties_keep_the_lower_class_first_so_entry_zero_is_the_argmax() -> None:
    e, _ = engine(1)
    with torch.no_grad():
        for p in e.pipeline.store.masters()[0].params:
            p.zero_()  # every logit 0: all classes tie
    top = e.pipeline.predict_top_k(torch.randn(IN_FEATURES), 3)
    assert [c for c, _ in top] == [0, 1, 2]
    assert all(p == pytest.approx(1 / CLASSES) for _, p in top)


def test_k_below_one_is_refused() -> None:
    e, _ = engine(1)
    with pytest.raises(ConfigError, match="k >= 1"):
        e.pipeline.predict_top_k(torch.randn(IN_FEATURES), 0)
    with pytest.raises(ConfigError, match="top_k must be >= 1"):
        StreamEngine(tiny_units(num_units=1), FerretPolicy(make_plan(1, 1)).setup("tiny", 1, 1.0),
                     EngineSettings(top_k=0)).wall_clock()  # fmt: skip


def test_the_wall_clock_arrival_carries_the_top_k_of_the_master() -> None:
    e, _ = engine(2, k=3)
    items = stream(6)
    with e.wall_clock() as clock:
        for i, item in enumerate(items):
            expected = e.pipeline.predict_top_k(item.x, 3)  # drained: the master does not move meanwhile
            arrival = clock.submit(item.x, item.y, index=i).result(10)
            clock.drain(10)
            assert arrival.top_k == expected and len(arrival.top_k) == 3
            assert (arrival.prediction, arrival.confidence) == arrival.top_k[0]
    assert EngineSettings().top_k == 1  # the default: the prediction alone
