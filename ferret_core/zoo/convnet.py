"""ConvNet: the paper's model for CIFAR-10/100, SVHN, Tiny-ImageNet and CORe50.

The paper does not define it; we use the common three-block CIFAR network of the online
continual-learning literature: three 3×3 convolutions (32, 64, 128 channels, "same" padding), each
followed by ReLU and a 2×2 max-pool, then fc256 and the classifier (≈0.62M parameters at 32×32).
No normalisation layers (``norm`` is ignored). Other square input sizes work (the first linear layer
sees 128·⌊s/8⌋² features), e.g. 64 for Tiny-ImageNet.

Units: conv1 | conv2 | conv3 (each conv + ReLU + max-pool) | Flatten + Linear(2048, 256) + ReLU |
Linear(256, K).
"""

from __future__ import annotations

from torch import nn

from ferret_core.zoo.base import MaxPool2d, ZooModel, require_spatial

DEFAULT_INPUT_SIZE = 32
DEFAULT_IN_CHANNELS = 3
WIDTHS: tuple[int, int, int] = (32, 64, 128)
HIDDEN = 256


def build(*, num_classes: int, input_size: int | None = None, in_channels: int | None = None) -> ZooModel:
    size = input_size or DEFAULT_INPUT_SIZE
    channels = in_channels or DEFAULT_IN_CHANNELS
    final = size // 8  # three 2×2 max-pools after size-preserving convolutions
    require_spatial("convnet", size, final, minimum=8)
    units: list[nn.Module] = []
    previous = channels
    for width in WIDTHS:
        units.append(nn.Sequential(nn.Conv2d(previous, width, 3, padding=1), nn.ReLU(), MaxPool2d(2)))
        previous = width
    units.append(nn.Sequential(nn.Flatten(), nn.Linear(previous * final * final, HIDDEN), nn.ReLU()))
    units.append(nn.Sequential(nn.Linear(HIDDEN, num_classes)))
    return ZooModel(
        "convnet",
        tuple(units),
        (channels, size, size),
        num_classes,
        unit_names=("conv1", "conv2", "conv3", "fc1", "fc2"),
    )
