"""Predictions never wait behind training: the wall clock's prediction executor is its own
thread, reads the master without the pipeline's lock or a stage's update lock, and only takes the pipeline
lock for the short dispatch. A backward pass held open must not hold back the next item's prediction."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from tests.unit.test_engine_support import CLASSES, make_plan, stream, tiny_units


class _HoldBackward(torch.autograd.Function):
    """Identity whose backward waits until the test releases it (and says when it started)."""

    entered = threading.Event()
    release = threading.Event()

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return x.view_as(x)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        _HoldBackward.entered.set()
        if not _HoldBackward.release.wait(timeout=60):
            raise TimeoutError("the test never released the backward pass")
        return grad


class _Held(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.inner(x)
        return _HoldBackward.apply(out) if torch.is_grad_enabled() else out  # type: ignore[no-any-return]


@pytest.mark.parametrize("inline", [False, True], ids=["prediction-thread", "inline"])
def test_predictions_run_while_a_backward_pass_is_held_open(inline: bool) -> None:
    _HoldBackward.entered.clear()
    _HoldBackward.release.clear()
    units = tiny_units(num_units=2)
    units[1] = _Held(units[1])
    plan = make_plan(2, 1)
    engine = StreamEngine(
        units, FerretPolicy(plan).setup("tiny", len(units), 0.0), EngineSettings(keep_trace=False, validate=False)
    )
    items = stream(6)
    clock = engine.wall_clock(inline_predictions=inline)
    with clock:
        try:
            first = clock.outcome(clock.submit(items[0].x, items[0].y), timeout=30)
            assert first.skipped is None  # admitted: its backward will be held
            assert _HoldBackward.entered.wait(timeout=30), "the first item's backward never started"
            # the backward is held; every later item is still predicted (and answered) meanwhile
            later = [clock.outcome(clock.submit(item.x, item.y), timeout=30) for item in items[1:]]
            assert [a.index for a in later] == [1, 2, 3, 4, 5]
            assert all(0 <= a.prediction < CLASSES for a in later)
            assert _HoldBackward.entered.is_set() and not _HoldBackward.release.is_set()
            with engine.pipeline.lock:  # nothing holds the pipeline lock while a backward runs
                assert engine.pipeline.counters.backwards[0][1] == 0
        finally:
            _HoldBackward.release.set()
        clock.drain(timeout=60)
    assert engine.pipeline.counters.backwards[0][1] >= 1
