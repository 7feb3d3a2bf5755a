"""The norm guard (ferret_core/engine/step_guard.py): one SGD step changes a stage's weights by at most
``max_step_ratio`` of their norm, a step within the bound is untouched, and a burst of ±1000 inputs that
makes the unguarded digits MLP's forward overflow (tests/unit/test_model_diverged.py) leaves the guarded
one finite: no ModelDivergedError, no non-finite confidence, finite weights."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from ferret_core.engine import EngineSettings, Oracle, StreamEngine
from ferret_core.engine.optim import SGD
from ferret_core.engine.step_guard import _norm, bounded, finite_norm, step_scale
from ferret_core.errors import ConfigError
from services.config import load_settings
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import build_zoo_model
from tests.unit.test_engine_support import make_plan, sequential_model, stream, tiny_units
from tests.unit.test_model_diverged import large_inputs


def test_a_large_step_is_scaled_to_the_bound_and_a_small_one_is_untouched() -> None:
    params = [torch.full((10,), 1.0), torch.full((6,), 1.0)]  # ‖θ‖ = 4
    huge = [torch.full((10,), 1e6), torch.full((6,), 1e6)]
    step = [lr_g * 1e-3 for lr_g in bounded(params, huge, 1e-3, 0.1)]
    norm = math.sqrt(sum(float(s.pow(2).sum()) for s in step))
    assert norm == pytest.approx(0.4, rel=1e-5)  # 0.1 · ‖θ‖
    small = [torch.full((10,), 1.0), torch.full((6,), 1.0)]
    assert bounded(params, small, 1e-3, 0.1) is small  # 1e-3 · 4 ≤ 0.4: the same tensors
    assert bounded(params, huge, 1e-3, None) is huge  # off


def test_zero_weights_use_the_floor_and_non_finite_gradients_are_left_to_the_engine() -> None:
    zeros = [torch.zeros(4)]
    assert step_scale(zeros, [torch.full((4,), 10.0)], 1.0, 0.5) == pytest.approx(0.5 / 20.0)  # bound 0.5 · 1
    assert step_scale(zeros, [torch.tensor([math.inf, 0.0, 0.0, 0.0])], 1.0, 0.5) == 1.0


def test_sgd_applies_the_guard_in_place_and_out_of_place() -> None:
    params = [torch.ones(4)]  # ‖θ‖ = 2
    grads = [torch.full((4,), 100.0)]
    out_of_place = SGD(lr=1.0, max_step_ratio=0.1).step(0, params, grads)
    assert float((out_of_place[0] - params[0]).norm()) == pytest.approx(0.2, rel=1e-5)
    storage = [params[0].clone()]
    in_place = SGD(lr=1.0, max_step_ratio=0.1).step(0, storage, grads, out=storage)
    torch.testing.assert_close(in_place[0], out_of_place[0])
    with pytest.raises(ConfigError, match="max_step_ratio"):
        SGD(max_step_ratio=0.0)


def test_a_burst_of_extreme_inputs_never_yields_a_non_finite_forward() -> None:
    settings = load_settings(None, env={"FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp"})
    assert settings.guard.max_step_ratio is not None  # on by default
    model = build_zoo_model(settings)
    learner = EngineLearner(model, make_plan(2, 2, num_units=model.num_units), settings)
    try:
        for i, (x, y) in enumerate(large_inputs(300)):  # the unguarded model diverges within ~100 of them
            outcome = learner.arrive(i, torch.from_numpy(x), y)  # raises ModelDivergedError on a non-finite output
            assert math.isfinite(outcome.confidence) and all(math.isfinite(p) for _, p in outcome.top_k)
            learner.drain(30)
        state = learner.state_tensors()
    finally:
        learner.close()
    assert all(bool(torch.isfinite(t.float()).all()) for t in state.values())
    stats = learner.stats()
    # the burst was trained on: every item back-propagated, or its non-finite loss or gradient dropped (the
    # engine's own guard: float32 overflows in the loss of some of these inputs whatever the weights)
    assert stats.backward_passes >= 100 and stats.backward_passes + stats.non_finite == 300


def reference_scale(params: list[torch.Tensor], grads: list[torch.Tensor], lr: float, ratio: float) -> float:
    """The guard's bound written out, with both norms always taken (float64 throughout)."""
    step = lr * math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads))
    if not math.isfinite(step) or step == 0.0:
        return 1.0
    bound = ratio * max(math.sqrt(sum(float(p.double().pow(2).sum()) for p in params)), 1.0)
    return 1.0 if step <= bound else bound / step


finite_floats = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False, width=32)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(finite_floats, min_size=1, max_size=12),
    st.lists(finite_floats, min_size=1, max_size=12),
    st.sampled_from([1e-3, 0.1, 1.0]),
    st.sampled_from([0.01, 0.1, 1.0]),
)
def test_the_scale_matches_the_bound_written_out_with_or_without_a_given_norm(
    theta: list[float], grad: list[float], lr: float, ratio: float
) -> None:
    params, grads = [torch.tensor(theta)], [torch.tensor(grad)]
    expected = reference_scale(params, grads, lr, ratio)
    assert step_scale(params, grads, lr, ratio) == pytest.approx(expected, rel=1e-5)
    norm = finite_norm(grads)
    assert norm is not None
    assert step_scale(params, grads, lr, ratio, norm) == step_scale(params, grads, lr, ratio)


def test_a_step_within_the_ratio_itself_never_reads_the_weights() -> None:
    grads = [torch.full((4,), 0.01)]  # lr·‖g‖ = 0.02 ≤ r = 0.1 ≤ r·max(‖θ‖, 1)
    weights = [torch.full((4,), math.nan)]  # a norm of these would make the scale NaN, not 1.0
    assert step_scale(weights, grads, 1.0, 0.1) == 1.0
    assert step_scale(weights, grads, 1.0, 0.1, grad_norm=0.02) == 1.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=6),
        min_size=1,
        max_size=4,
    )
)
def test_finite_norm_is_none_exactly_when_an_element_is_not_finite_and_else_the_guards_norm(
    values: list[list[float]],
) -> None:
    tensors = [torch.tensor(v, dtype=torch.float32) for v in values]
    expected_finite = all(math.isfinite(x) for v in values for x in v)
    norm = finite_norm(tensors)
    assert (norm is not None) is expected_finite
    if norm is not None:
        assert norm == _norm(tensors)


def test_finite_norm_survives_finite_values_whose_squares_overflow_float32() -> None:
    big = torch.full((3,), 3e38)  # finite; its float32 norm overflows
    norm = finite_norm([big, torch.ones(2)])
    assert norm is not None and norm == pytest.approx(math.sqrt(3 * float(big[0]) ** 2 + 2), rel=1e-9)
    assert finite_norm([big, torch.tensor([1.0, math.nan])]) is None
    assert finite_norm([torch.tensor([-math.inf])]) is None


def guarded_sgd(
    units: list, items: list, lr: float, ratio: float, accumulation: int = 1
) -> tuple[dict[str, torch.Tensor], int]:
    """The reference with the norm guard written out (float64 norms over the whole model, one stage): the
    sum of each ``accumulation`` items' gradients as one step ``lr·g``, scaled to at most
    ``ratio·max(‖θ‖, 1)``; also how many steps it scaled."""
    model = sequential_model(units)
    params = list(model.parameters())
    scaled = 0
    for start in range(0, len(items) - accumulation + 1, accumulation):
        total = [torch.zeros_like(p) for p in params]
        for item in items[start : start + accumulation]:
            loss = F.cross_entropy(model(item.x.unsqueeze(0)), torch.tensor([item.y]))
            total = [t + g for t, g in zip(total, torch.autograd.grad(loss, params), strict=True)]
        with torch.no_grad():
            step = lr * math.sqrt(sum(float(g.double().pow(2).sum()) for g in total))
            bound = ratio * max(math.sqrt(sum(float(p.double().pow(2).sum()) for p in params)), 1.0)
            scale = 1.0 if step <= bound else bound / step
            scaled += scale < 1.0
            for p, g in zip(params, total, strict=True):
                p.sub_(g * scale if scale < 1.0 else g, alpha=lr)
    return {k: v.detach() for k, v in model.state_dict().items()}, scaled


@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_the_thread_engine_under_the_norm_guard_equals_the_guard_written_out(ratio: float) -> None:
    """One worker, one stage on the thread engine: the non-finite check's norm reaches the guard
    (StageUpdater.offer → GradientBuffer.norm → SGD.step); the weights are the guard's computed from
    scratch, where it scales steps (0.05) and where most steps stay below r itself (0.3)."""
    units, items = tiny_units(), stream(30)
    setup = Oracle().setup("tiny", len(units), arrival_interval=1.0)
    engine = StreamEngine(units, setup, EngineSettings(lr=0.1, max_step_ratio=ratio))
    engine.run_virtual(items, None, arrival_interval=1.0)
    reference, scaled = guarded_sgd(units, items, 0.1, ratio)
    if ratio < 0.3:
        assert 0 < scaled < len(items)
    torch.testing.assert_close(engine.pipeline.master_state()[0], reference, rtol=1e-5, atol=1e-6)
