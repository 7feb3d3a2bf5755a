"""MLP: the paper's tabular / flat-image baseline model (§Experiments, "Multi-Layer Perceptron").

The paper does not give its MLP's sizes; we use two hidden layers of 256 and 128 ReLU units. The first
unit flattens its input, so the model accepts a flat feature vector (Covertype: 54 features, 7 classes)
or an image (MNIST: 1×28×28 = 784 features) alike. No normalisation layers (``norm`` is ignored).

Units: ``[Flatten, Linear(F, 256), ReLU]``, ``[Linear(256, 128), ReLU]``, ``[Linear(128, K)]``.
"""

from __future__ import annotations

import math

from torch import nn

from ferret_core.errors import ConfigError
from ferret_core.zoo.base import ZooModel

HIDDEN: tuple[int, int] = (256, 128)
DEFAULT_IN_FEATURES = 784


def build(
    *,
    num_classes: int,
    in_features: int | None = None,
    input_size: int | None = None,
    in_channels: int | None = None,
) -> ZooModel:
    """An MLP over ``in_features`` inputs, or over ``in_channels``×``input_size``² images when given."""
    if input_size is not None:
        input_shape: tuple[int, ...] = (in_channels or 1, input_size, input_size)
        flat = math.prod(input_shape)
        if in_features is not None and in_features != flat:
            raise ConfigError(
                f"mlp: in_features={in_features} contradicts input_size={input_size} and "
                f"in_channels={in_channels or 1} ({flat} features); give one or make them agree"
            )
    elif in_channels is not None:
        raise ConfigError("mlp: in_channels needs input_size (or give in_features for flat inputs)")
    else:
        flat = in_features if in_features is not None else DEFAULT_IN_FEATURES
        input_shape = (flat,)
    h1, h2 = HIDDEN
    units: tuple[nn.Module, ...] = (
        nn.Sequential(nn.Flatten(), nn.Linear(flat, h1), nn.ReLU()),
        nn.Sequential(nn.Linear(h1, h2), nn.ReLU()),
        nn.Sequential(nn.Linear(h2, num_classes)),
    )
    return ZooModel("mlp", units, input_shape, num_classes, unit_names=("fc1", "fc2", "fc3"))
