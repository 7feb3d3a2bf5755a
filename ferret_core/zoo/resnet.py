"""ResNet-18 (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016), as in the paper.

Layout and initialisation follow torchvision's ``resnet18`` (BasicBlock × [2, 2, 2, 2], widths 64-512,
He fan-out init; 11,689,512 parameters at 224×224 and 1000 classes) with two changes:

- normalisation is GroupNorm (``norm="group"``, default) or eval-mode BatchNorm (``norm="batch-eval"``),
  because train-mode BatchNorm breaks on batch-1 streams (DESIGN §2); the parameter count is the same;
- small inputs (``input_size`` < 96, e.g. CIFAR's 32) use the CIFAR stem of He et al. §4.2 as adapted by
  most CIFAR ResNet-18 implementations: a 3×3 stride-1 convolution and no max-pool. Larger inputs
  (224) use the ImageNet stem: 7×7 stride-2 convolution, norm, ReLU, 3×3 stride-2 max-pool.

Units (10): ``stem``, ``layer1.0`` … ``layer4.1`` (one residual block each: a block is never split),
``head`` (global average pool, flatten, fc). Block sub-module names match torchvision's (``conv1``,
``bn1``, ``conv2``, ``bn2``, ``downsample``) so a converted checkpoint maps by renaming the prefixes.
"""

from __future__ import annotations

import torch
from torch import nn

from ferret_core.zoo.base import MaxPool2d, ZooModel, classifier_head, init_conv_norm, make_norm

DEFAULT_INPUT_SIZE = 32
DEFAULT_IN_CHANNELS = 3
IMAGENET_STEM_MIN_SIZE = 96
WIDTHS: tuple[int, ...] = (64, 128, 256, 512)
BLOCKS_PER_STAGE = 2


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a skip connection (projection shortcut when the shape changes)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = make_norm(norm, out_channels)  # named as torchvision's; GroupNorm under norm="group"
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = make_norm(norm, out_channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != out_channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                make_norm(norm, out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity: torch.Tensor = x if self.downsample is None else self.downsample(x)
        out: torch.Tensor = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        result: torch.Tensor = self.relu(out + identity)  # out of place: safe under functional_call
        return result


def _stem(in_channels: int, input_size: int, norm: str) -> nn.Sequential:
    if input_size >= IMAGENET_STEM_MIN_SIZE:
        return nn.Sequential(
            nn.Conv2d(in_channels, WIDTHS[0], 7, stride=2, padding=3, bias=False),
            make_norm(norm, WIDTHS[0]),
            nn.ReLU(),
            MaxPool2d(3, stride=2, padding=1),
        )
    return nn.Sequential(
        nn.Conv2d(in_channels, WIDTHS[0], 3, stride=1, padding=1, bias=False),
        make_norm(norm, WIDTHS[0]),
        nn.ReLU(),
    )


def build(*, num_classes: int, input_size: int | None = None, in_channels: int | None = None, norm: str) -> ZooModel:
    size = input_size or DEFAULT_INPUT_SIZE
    channels = in_channels or DEFAULT_IN_CHANNELS
    units: list[nn.Module] = [_stem(channels, size, norm)]
    names = ["stem"]
    previous = WIDTHS[0]
    for stage, width in enumerate(WIDTHS):
        for index in range(BLOCKS_PER_STAGE):
            stride = 2 if stage > 0 and index == 0 else 1
            units.append(BasicBlock(previous, width, stride, norm))
            names.append(f"layer{stage + 1}.{index}")
            previous = width
    units.append(classifier_head(previous, num_classes))
    names.append("head")
    init_conv_norm(units)
    return ZooModel("resnet18", tuple(units), (channels, size, size), num_classes, unit_names=tuple(names))
