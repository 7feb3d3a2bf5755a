"""MobileNet v1 (Howard et al., "MobileNets: Efficient Convolutional Neural Networks for Mobile Vision
Applications", 2017, Table 1), width multiplier 1.0, as the paper cites.

Stem: 3×3 convolution to 32 channels, norm, ReLU (stride 2 for inputs ≥ 96, e.g. 224; stride 1 for
small inputs such as CIFAR's 32, so the final map is 2×2 rather than vanishing). Then 13
depthwise-separable blocks (3×3 depthwise conv, norm, ReLU, 1×1 pointwise conv, norm, ReLU; each ONE
unit), then the head: global average pool, flatten, fc. 4,231,976 parameters at 1000 classes, as the
reference implementation's trainable count. Convolutions have no bias; He fan-out initialisation.
Normalisation: GroupNorm (``norm="group"``, default) or eval-mode BatchNorm (``norm="batch-eval"``),
see :mod:`ferret_core.zoo.base`.
"""

from __future__ import annotations

from torch import nn

from ferret_core.zoo.base import ZooModel, classifier_head, conv_norm_relu, init_conv_norm

DEFAULT_INPUT_SIZE = 32
DEFAULT_IN_CHANNELS = 3
SMALL_INPUT_BELOW = 96
STEM_WIDTH = 32
# (output channels, stride) of the 13 depthwise-separable blocks (Howard et al., Table 1).
BLOCKS: tuple[tuple[int, int], ...] = (
    (64, 1),
    (128, 2),
    (128, 1),
    (256, 2),
    (256, 1),
    (512, 2),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (512, 1),
    (1024, 2),
    (1024, 1),
)


def depthwise_separable(in_channels: int, out_channels: int, stride: int, norm: str) -> nn.Sequential:
    """3×3 depthwise conv → norm → ReLU → 1×1 pointwise conv → norm → ReLU (one unit)."""
    return nn.Sequential(
        *conv_norm_relu(in_channels, in_channels, kernel=3, stride=stride, norm=norm, groups=in_channels),
        *conv_norm_relu(in_channels, out_channels, kernel=1, stride=1, norm=norm),
    )


def build(*, num_classes: int, input_size: int | None = None, in_channels: int | None = None, norm: str) -> ZooModel:
    size = input_size or DEFAULT_INPUT_SIZE
    channels = in_channels or DEFAULT_IN_CHANNELS
    stem_stride = 1 if size < SMALL_INPUT_BELOW else 2
    units: list[nn.Module] = [
        nn.Sequential(*conv_norm_relu(channels, STEM_WIDTH, kernel=3, stride=stem_stride, norm=norm))
    ]
    names = ["stem"]
    previous = STEM_WIDTH
    for index, (width, stride) in enumerate(BLOCKS):
        units.append(depthwise_separable(previous, width, stride, norm))
        names.append(f"dw{index + 1}")
        previous = width
    units.append(classifier_head(previous, num_classes))
    names.append("head")
    init_conv_norm(units)
    return ZooModel("mobilenet", tuple(units), (channels, size, size), num_classes, unit_names=tuple(names))
