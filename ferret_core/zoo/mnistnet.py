"""MNISTNet: the paper's model for MNIST, Fashion-MNIST and EMNIST (and their Split-* versions).

The paper does not define it; we follow the classic PyTorch MNIST example (``pytorch/examples``,
``mnist/main.py``: conv32 → conv64 → max-pool → fc128 → fc10, 1.2M parameters) without its dropout
layers, since the stream trains on one item at a time. No normalisation layers (``norm`` is ignored).

Units at the default 1×28×28 input (the planner's golden tests rely on these counts):

====  ===========================================  ==========
unit  modules                                      parameters
====  ===========================================  ==========
0     Conv2d(1, 32, 3), ReLU                       320
1     Conv2d(32, 64, 3), ReLU, MaxPool2d(2)        18,496
2     Flatten, Linear(9216, 128), ReLU             1,179,776
3     Linear(128, 10)                              1,290
====  ===========================================  ==========
"""

from __future__ import annotations

from torch import nn

from ferret_core.zoo.base import MaxPool2d, ZooModel, require_spatial

DEFAULT_INPUT_SIZE = 28
DEFAULT_IN_CHANNELS = 1


def build(*, num_classes: int, input_size: int | None = None, in_channels: int | None = None) -> ZooModel:
    size = input_size or DEFAULT_INPUT_SIZE
    channels = in_channels or DEFAULT_IN_CHANNELS
    final = (size - 4) // 2  # two valid 3×3 convolutions, then a 2×2 max-pool
    require_spatial("mnistnet", size, final, minimum=6)
    units: tuple[nn.Module, ...] = (
        nn.Sequential(nn.Conv2d(channels, 32, 3), nn.ReLU()),
        nn.Sequential(nn.Conv2d(32, 64, 3), nn.ReLU(), MaxPool2d(2)),
        nn.Sequential(nn.Flatten(), nn.Linear(64 * final * final, 128), nn.ReLU()),
        nn.Sequential(nn.Linear(128, num_classes)),
    )
    return ZooModel(
        "mnistnet",
        units,
        (channels, size, size),
        num_classes,
        unit_names=("conv1", "conv2+pool", "fc1", "fc2"),
    )
