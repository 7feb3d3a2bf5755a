"""The zoo's model type and the building blocks its families share.

A zoo model is an ordered tuple of *units*: the granularity at which the partitioner may cut the model
into pipeline stages (Alg. 3's "layers"). A unit is any ``nn.Module`` mapping one tensor to one tensor;
a residual block is one unit, because its skip connection cannot be cut.

Normalisation (DESIGN §2): a batch-1 stream breaks BatchNorm in train mode (a 1×1 spatial map has no
variance, and its running statistics are buffers every pipeline worker would mutate). Models with
normalisation layers therefore use either

- ``norm="group"`` (the default): :class:`torch.nn.GroupNorm` with the largest group count ≤ 32 that
  divides the channel count (32 for every width the zoo uses); no buffers, same parameter count as
  BatchNorm's affine weights; or
- ``norm="batch-eval"``: :class:`EvalBatchNorm2d`, a BatchNorm2d that is always evaluated in eval mode
  (it normalises with its running statistics and never updates them, whatever ``train()`` is called
  with). Use it with weights whose running statistics were trained elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Self

import torch
from torch import nn
from torch.nn import functional as F

from ferret_core.errors import ConfigError

NORMS: tuple[str, ...] = ("group", "batch-eval")
MAX_GROUPS = 32


@dataclass(frozen=True)
class ZooModel:
    """A model as the ordered units the partitioner can split.

    ``input_shape`` is per sample (no batch dimension). ``unit_names`` are readable labels, one per
    unit (``unit0``, ``unit1``, … when not given); the profiler uses them as layer names.
    The units are the live modules: :meth:`as_sequential` wraps them without copying.
    """

    name: str
    units: tuple[nn.Module, ...]
    input_shape: tuple[int, ...]
    num_classes: int
    unit_names: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.units:
            raise ConfigError(f"model {self.name!r} has no units; a model needs at least one")
        if not self.unit_names:
            object.__setattr__(self, "unit_names", tuple(f"unit{i}" for i in range(len(self.units))))
        if len(self.unit_names) != len(self.units):
            raise ConfigError(f"model {self.name!r}: {len(self.unit_names)} unit names for {len(self.units)} units")

    @property
    def num_units(self) -> int:
        return len(self.units)

    @property
    def num_params(self) -> int:
        """Parameter elements of the whole model (Σ_l |ŵ_l|)."""
        return sum(p.numel() for unit in self.units for p in unit.parameters())

    def as_sequential(self) -> nn.Sequential:
        """The units chained in an ``nn.Sequential`` (shares the modules; state-dict keys ``"<i>.…"``)."""
        return nn.Sequential(*self.units)


class MaxPool2d(nn.MaxPool2d):
    """``nn.MaxPool2d`` whose inference forward on CPU pools a channels-last copy: the same values, ~4× less
    time where nothing needs its indices.

    Why: torch's CPU kernel for a contiguous (NCHW) map is not vectorised over channels; MNISTNet's
    64×24×24 pool took 0.23–0.27 ms per item, as long as the 32→64 convolution before it and a quarter of
    the model's forward, and 0.06 ms (copy in and out included) channels-last (torch 2.13, one thread;
    ``docs/history.md`` stop 35). A trainer predicts every item (and its guard's shadow again) without
    gradients, so the record path pays it twice per item. With gradients the kernels cost the same, and
    the standard path keeps the training step bit for bit as before; the output is contiguous either way,
    so the next unit (``Flatten``) sees what it always saw. No parameters, no buffers: state dicts and
    snapshots are unchanged."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if (
            self.return_indices
            or input.dim() != 4
            or input.device.type != "cpu"
            or (torch.is_grad_enabled() and input.requires_grad)
        ):
            out: torch.Tensor = super().forward(input)
            return out
        pooled = F.max_pool2d(
            input.contiguous(memory_format=torch.channels_last),
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            ceil_mode=self.ceil_mode,
        )
        return pooled.contiguous()


class EvalBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d frozen in eval mode: normalises with its running statistics and never updates them.

    ``train(True)`` is ignored, so the module behaves the same on a batch of 1 and under concurrent
    pipeline workers (DESIGN §2). The affine weight and bias are still trainable parameters.
    """

    def __init__(self, num_features: int) -> None:
        super().__init__(num_features)
        super().train(False)

    def train(self, mode: bool = True) -> Self:
        return super().train(False)


def group_count(channels: int, max_groups: int = MAX_GROUPS) -> int:
    """The largest number of groups ≤ ``max_groups`` that divides ``channels``."""
    return max(g for g in range(1, min(max_groups, channels) + 1) if channels % g == 0)


def check_norm(norm: str) -> str:
    if norm not in NORMS:
        raise ConfigError(f"unknown norm {norm!r}: expected one of {', '.join(NORMS)}")
    return norm


def make_norm(norm: str, channels: int) -> nn.Module:
    """A normalisation layer over ``channels`` feature maps (see the module docstring)."""
    if check_norm(norm) == "group":
        return nn.GroupNorm(group_count(channels), channels)
    return EvalBatchNorm2d(channels)


def conv_norm_relu(
    in_channels: int, out_channels: int, *, kernel: int, stride: int, norm: str, groups: int = 1
) -> list[nn.Module]:
    """Conv (no bias, "same" padding) → norm → ReLU, as a list to splice into a unit."""
    return [
        nn.Conv2d(
            in_channels,
            out_channels,
            kernel,
            stride=stride,
            padding=kernel // 2,
            groups=groups,
            bias=False,
        ),
        make_norm(norm, out_channels),
        nn.ReLU(),
    ]


def classifier_head(in_features: int, num_classes: int) -> nn.Sequential:
    """Global average pool → flatten → linear: the last unit of ResNet and MobileNet."""
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(in_features, num_classes))


def init_conv_norm(units: Sequence[nn.Module]) -> None:
    """He (fan-out) initialisation of convolutions, unit weight and zero bias of norms.

    The initialisation of torchvision's ResNet and MobileNet; draws from the global RNG, which
    :func:`ferret_core.zoo.build_model` seeds inside ``torch.random.fork_rng``.
    """
    for unit in units:
        for module in unit.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, (nn.GroupNorm, nn.BatchNorm2d)):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)


def check_positive(**values: int | None) -> None:
    for key, value in values.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")


def require_spatial(model: str, input_size: int, final: int, minimum: int) -> None:
    if final < 1:
        raise ConfigError(
            f"{model}: input_size {input_size} is too small (the feature map vanishes); use input_size >= {minimum}"
        )
