"""Arrivals that queue up together are predicted in one forward pass (issue 7 item 3, the latency tail
after a pause): the same classes and probabilities as one by one, dispatched in submission order, and a
failure reaches every queued arrival instead of leaving it waiting."""

from __future__ import annotations

import pytest
import torch

from ferret_core.engine import EngineSettings, FerretPolicy, StreamEngine
from tests.unit.test_engine_support import make_plan, stream, tiny_units


def _engine(workers: int = 2) -> StreamEngine:
    units = tiny_units(num_units=2)
    return StreamEngine(
        units,
        FerretPolicy(make_plan(2, workers)).setup("tiny", len(units), 0.0),
        EngineSettings(keep_trace=False, validate=False),
    )


def test_a_batch_predicts_what_each_sample_alone_predicts() -> None:
    pipeline = _engine().pipeline
    xs = torch.stack([item.x for item in stream(12)])
    batched = pipeline.predict_top_k_batch(xs, 3)
    for x, top_k in zip(xs, batched, strict=True):
        alone = pipeline.predict_top_k(x, 3)
        assert [c for c, _ in top_k] == [c for c, _ in alone]
        assert [p for _, p in top_k] == pytest.approx([p for _, p in alone], abs=1e-5)


def test_queued_arrivals_are_predicted_together_and_dispatched_in_order() -> None:
    engine = _engine(workers=2)
    pipeline = engine.pipeline
    sizes: list[int] = []
    single, batch = pipeline.predict_top_k, pipeline.predict_top_k_batch
    pipeline.predict_top_k = lambda x, k: (sizes.append(1), single(x, k))[1]  # type: ignore[method-assign]
    pipeline.predict_top_k_batch = lambda xs, k: (sizes.append(len(xs)), batch(xs, k))[1]  # type: ignore[method-assign]
    items = stream(10)
    with engine.wall_clock() as clock:
        with pipeline.lock:  # the prediction thread cannot dispatch: later arrivals queue up behind it
            futures = [clock.submit(item.x, item.y) for item in items]
        arrivals = [f.result(timeout=30) for f in futures]
        clock.drain(timeout=60)
    assert [a.index for a in arrivals] == list(range(10))
    assert all(a.worker == a.index % 2 for a in arrivals if a.skipped is None)
    assert sum(sizes) == 10 and max(sizes) > 1  # the queued ones went through one forward pass


def test_a_failed_prediction_fails_every_queued_arrival() -> None:
    engine = _engine()
    pipeline = engine.pipeline

    def broken(*_: object) -> object:
        raise RuntimeError("forward failed")

    pipeline.predict_top_k = broken  # type: ignore[method-assign]
    pipeline.predict_top_k_batch = broken  # type: ignore[method-assign]
    clock = engine.wall_clock().start()
    with pipeline.lock:
        futures = [clock.submit(item.x, item.y) for item in stream(5)]
    for future in futures:  # none is left waiting
        with pytest.raises(RuntimeError, match="forward failed"):
            future.result(timeout=30)
    clock.close(reraise=False)
