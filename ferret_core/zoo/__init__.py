"""The model zoo: MLP, MNISTNet, ConvNet, ResNet-18 and MobileNet v1 as lists of partitionable units.

No torchvision (it does not import on the CPU torch here, DESIGN §5). Each family's module says which
paper or reference it follows; :mod:`ferret_core.zoo.base` says how normalisation works on batch-1
streams. A user's own model becomes a :class:`ZooModel` through :mod:`ferret_core.zoo.custom`.
"""

from ferret_core.zoo.base import NORMS, EvalBatchNorm2d, ZooModel
from ferret_core.zoo.custom import model_from_factory, model_from_units
from ferret_core.zoo.model_registry import MODEL_NAMES, build_model, load_weights, save_weights

__all__ = [
    "MODEL_NAMES",
    "NORMS",
    "EvalBatchNorm2d",
    "ZooModel",
    "build_model",
    "load_weights",
    "model_from_factory",
    "model_from_units",
    "save_weights",
]
