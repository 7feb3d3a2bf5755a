"""The zoo's :class:`~ferret_core.zoo.base.MaxPool2d`: the channels-last inference path gives exactly what
``nn.MaxPool2d`` gives, and training takes torch's own path (gradients unchanged, bit for bit)."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

from ferret_core.zoo import build_model
from ferret_core.zoo.base import MaxPool2d


@settings(max_examples=40, deadline=None)
@given(
    batch=st.integers(1, 4),
    channels=st.integers(1, 70),
    size=st.integers(3, 20),
    kernel=st.integers(2, 3),
    stride=st.sampled_from([None, 1, 2]),
    padding=st.integers(0, 1),
    ceil_mode=st.booleans(),
    relu=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_inference_path_equals_nn_max_pool(
    batch: int,
    channels: int,
    size: int,
    kernel: int,
    stride: int | None,
    padding: int,
    ceil_mode: bool,
    relu: bool,
    seed: int,
) -> None:
    x = torch.randn(batch, channels, size, size, generator=torch.Generator().manual_seed(seed))
    if relu:  # ties: whole windows of zeros, as after the zoo's ReLUs
        x = x.relu()
    kwargs = {"stride": stride, "padding": padding, "ceil_mode": ceil_mode}
    with torch.no_grad():
        got = MaxPool2d(kernel, **kwargs)(x)
        expected = nn.MaxPool2d(kernel, **kwargs)(x)
    assert torch.equal(got, expected)
    assert got.is_contiguous()


def test_the_fast_path_is_taken_only_without_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    layouts: list[bool] = []
    original = F.max_pool2d

    def spy(x: torch.Tensor, *args: object, **kwargs: object) -> object:
        layouts.append(x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous())
        return original(x, *args, **kwargs)

    monkeypatch.setattr(F, "max_pool2d", spy)
    monkeypatch.setattr(nn.functional, "max_pool2d", spy)
    pool = MaxPool2d(2)
    x = torch.randn(1, 8, 6, 6)
    with torch.no_grad():
        pool(x)
    pool(x)  # an input without grad under grad mode: nothing to differentiate either
    pool(x.requires_grad_())
    assert layouts == [True, True, False]


@pytest.mark.parametrize("name", ["mnistnet", "convnet"])
def test_zoo_models_predict_and_train_as_with_nn_max_pool(name: str) -> None:
    model = build_model(name, seed=0)
    fast = model.as_sequential()
    reference = copy.deepcopy(fast)
    for module in reference.modules():  # the same weights with torch's own pooling
        for child_name, child in module.named_children():
            if isinstance(child, MaxPool2d):
                setattr(module, child_name, nn.MaxPool2d(child.kernel_size, child.stride, child.padding))
    assert any(isinstance(m, MaxPool2d) for m in fast.modules())
    xs = torch.randn((5, *model.input_shape), generator=torch.Generator().manual_seed(1))
    ys = torch.arange(5) % model.num_classes
    with torch.no_grad():
        assert torch.equal(fast(xs), reference(xs))
    for net in (fast, reference):
        F.cross_entropy(net(xs), ys).backward()
    for p, q in zip(fast.parameters(), reference.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        assert torch.equal(p.grad, q.grad)
