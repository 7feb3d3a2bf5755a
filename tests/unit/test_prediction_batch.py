"""Arrivals that queue up together are predicted in one forward pass (the latency tail
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


@pytest.mark.parametrize("inline", [False, True], ids=["prediction-thread", "inline"])
def test_queued_arrivals_are_predicted_together_and_dispatched_in_order(inline: bool) -> None:
    engine = _engine(workers=2)
    pipeline = engine.pipeline
    sizes: list[int] = []
    single, batch = pipeline.predict_top_k, pipeline.predict_top_k_batch
    pipeline.predict_top_k = lambda x, k: (sizes.append(1), single(x, k))[1]  # type: ignore[method-assign]
    pipeline.predict_top_k_batch = lambda xs, k, v=None: (sizes.append(len(xs)), batch(xs, k, v))[1]  # type: ignore[method-assign]
    items = stream(10)
    with engine.wall_clock(inline_predictions=inline) as clock:
        with pipeline.lock:  # the prediction thread cannot dispatch: later arrivals queue up behind it
            futures = [clock.submit(item.x, item.y) for item in items]
        arrivals = [clock.outcome(f, timeout=30) for f in futures]
        clock.drain(timeout=60)
    assert [a.index for a in arrivals] == list(range(10))
    assert all(a.worker == a.index % 2 for a in arrivals if a.skipped is None)
    assert sum(sizes) == 10 and max(sizes) > 1  # the queued ones went through one forward pass


@pytest.mark.parametrize("inline", [False, True], ids=["prediction-thread", "inline"])
def test_a_failed_prediction_fails_every_queued_arrival(inline: bool) -> None:
    engine = _engine()
    pipeline = engine.pipeline

    def broken(*_: object) -> object:
        raise RuntimeError("forward failed")

    pipeline.predict_top_k = broken  # type: ignore[method-assign]
    pipeline.predict_top_k_batch = broken  # type: ignore[method-assign]
    clock = engine.wall_clock(inline_predictions=inline).start()
    with pipeline.lock:
        futures = [clock.submit(item.x, item.y) for item in stream(5)]
    for future in futures:  # none is left waiting
        with pytest.raises(RuntimeError, match="forward failed"):
            clock.outcome(future, timeout=30)
    with pytest.raises(RuntimeError, match="forward failed"):  # the clock stopped with the failure
        clock.submit(stream(1)[0].x, 0)
    clock.close(reraise=False)


def test_inline_predictions_close_fails_what_was_never_predicted() -> None:
    from ferret_core.engine.wall_clock import ClockStopped

    engine = _engine()
    clock = engine.wall_clock(inline_predictions=True).start()
    futures = [clock.submit(item.x, item.y) for item in stream(3)]
    clock.close()
    for future in futures:
        with pytest.raises(ClockStopped):
            future.result(timeout=1)


def test_inline_predictions_train_as_the_prediction_thread_does() -> None:
    """Same items, same plan: the same predictions, dispatch and final weights either way (1 worker:
    one order of updates)."""
    results = []
    for inline in (False, True):
        torch.manual_seed(0)
        engine = _engine(workers=1)
        with engine.wall_clock(inline_predictions=inline) as clock:
            arrivals = []
            for item in stream(20):
                arrivals.append(clock.outcome(clock.submit(item.x, item.y), timeout=30))
                clock.drain(timeout=60)
        masters = [t.clone() for v in engine.pipeline.masters() for t in v.params]
        results.append(([(a.prediction, a.skipped, a.worker) for a in arrivals], masters))
    assert results[0][0] == results[1][0]
    assert all(torch.equal(a, b) for a, b in zip(results[0][1], results[1][1], strict=True))


def test_an_arrival_carries_the_version_that_predicted_it() -> None:
    """Drained after every item (1 worker, 1 stage: one update per trained item), item i was predicted by
    the master after as many updates as items trained before it; held behind a queue, by an older one."""
    engine = _engine(workers=1)
    with engine.wall_clock(inline_predictions=True) as clock:
        arrivals = []
        for item in stream(12):
            arrivals.append(clock.outcome(clock.submit(item.x, item.y), timeout=30))
            clock.drain(timeout=60)
        trained_before = [sum(a.skipped is None for a in arrivals[:i]) for i in range(len(arrivals))]
        assert [a.version for a in arrivals] == [2 * t for t in trained_before]  # 2 stages: 2 versions each
        queued = [clock.submit(item.x, item.y) for item in stream(4)]  # predicted together, on one master
        versions = {clock.outcome(f, timeout=30).version for f in queued}
        clock.drain(timeout=60)
    assert versions == {2 * sum(a.skipped is None for a in arrivals)}


@pytest.mark.parametrize("case", ["random", "ties", "nan"])
def test_the_python_top_k_equals_torch_sort(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Few classes are sorted in Python from one read-out (``SORT_IN_PYTHON``): the same classes
    and probabilities, in the same order, as the stable ``torch.sort`` (ties: lower class first; a NaN row,
    a diverged model, sorts as torch does, so its NaN reaches the caller's check)."""
    from ferret_core.engine import predictor as predictor_module

    pipeline = _engine().pipeline
    xs = torch.stack([item.x for item in stream(12)])
    logits = predictor_module.predict_logits(pipeline.predictor.runners, pipeline.masters(), xs)
    if case == "ties":
        logits = torch.zeros_like(logits)
    elif case == "nan":
        logits[3, 0] = float("nan")
    monkeypatch.setattr(predictor_module, "predict_logits", lambda *args: logits)
    for k in (1, 3, 100):
        fast = pipeline.predict_top_k_batch(xs, k)
        monkeypatch.setattr(predictor_module, "SORT_IN_PYTHON", 0)
        slow = pipeline.predict_top_k_batch(xs, k)
        monkeypatch.setattr(predictor_module, "SORT_IN_PYTHON", 64)
        assert [[c for c, _ in row] for row in fast] == [[c for c, _ in row] for row in slow]
        assert repr(fast) == repr(slow)  # the same floats (and NaN where torch puts it)
