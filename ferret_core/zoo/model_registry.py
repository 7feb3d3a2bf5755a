"""Build zoo models by name, seeded, optionally loading a user-supplied state dict.

Pretrained ImageNet weights cannot be downloaded here; the paper's pretrained ResNet-18 / MobileNet are
reproduced by passing ``weights=`` a state-dict file of :meth:`ZooModel.as_sequential` (write one with
:func:`save_weights`). Loading uses ``torch.load(weights_only=True)``: no arbitrary unpickling.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch

from ferret_core.errors import ConfigError
from ferret_core.zoo import convnet, mlp, mnistnet, mobilenet, resnet
from ferret_core.zoo.base import ZooModel, check_norm, check_positive

MODEL_NAMES: tuple[str, ...] = ("mlp", "mnistnet", "convnet", "resnet18", "mobilenet")
_MAX_KEYS_SHOWN = 8


def build_model(
    name: str,
    *,
    num_classes: int = 10,
    input_size: int | None = None,
    in_channels: int | None = None,
    in_features: int | None = None,
    norm: str = "group",
    seed: int | None = 0,
    weights: str | Path | None = None,
) -> ZooModel:
    """Build the zoo model ``name`` (one of :data:`MODEL_NAMES`).

    ``input_size`` is the square image side (defaults: mnistnet 28, the others 32; mlp: flat input
    unless given), ``in_channels`` the image channels, ``in_features`` the mlp's flat input size.
    ``norm`` applies to resnet18 and mobilenet (see :mod:`ferret_core.zoo.base`). The same ``seed``
    gives the same initial weights; the global RNG state is left as it was (``seed=None`` draws from
    the global RNG instead). ``weights`` loads a state-dict file after initialisation.
    """
    if name not in MODEL_NAMES:
        raise ConfigError(f"unknown model {name!r}: expected one of {', '.join(MODEL_NAMES)}")
    check_positive(num_classes=num_classes, input_size=input_size, in_channels=in_channels, in_features=in_features)
    check_norm(norm)
    if in_features is not None and name != "mlp":
        raise ConfigError(f"in_features applies to mlp only, not {name!r}; use input_size / in_channels")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ConfigError(f"seed must be an integer or None, got {seed!r}")
    with seeded(seed):
        model = _BUILDERS[name](num_classes, input_size, in_channels, in_features, norm)
    if weights is not None:
        load_weights(model, weights)
    return model


def save_weights(model: ZooModel, path: str | Path) -> None:
    """Write the state dict of ``model.as_sequential()`` (the format ``weights=`` reads)."""
    torch.save(model.as_sequential().state_dict(), Path(path))


def load_weights(model: ZooModel, path: str | Path) -> None:
    """Load a state-dict file into ``model.as_sequential()``; mismatches raise :class:`ConfigError`.

    Keys are those of ``model.as_sequential().state_dict()`` (``"0.weight"``) or, for a model built from
    a named ``nn.Sequential``, that Sequential's own (``"conv1.weight"``). Read with
    ``torch.load(weights_only=True)``: tensors and plain containers only, never arbitrary objects.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"weights file {str(path)!r} does not exist")
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise ConfigError(f"weights file {str(path)!r} cannot be read as a state dict: {exc}") from exc
    if not isinstance(state, Mapping) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise ConfigError(
            f"weights file {str(path)!r} must hold a state dict (str → tensor), as written by "
            "torch.save(model.as_sequential().state_dict(), path)"
        )
    sequential = model.as_sequential()
    expected = sequential.state_dict()
    state = _by_unit_index(model, state, expected)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ConfigError(
            f"weights file {str(path)!r} does not match {model.name}: "
            f"{len(missing)} missing keys {_shown(missing)}, "
            f"{len(unexpected)} unexpected keys {_shown(unexpected)} "
            "(keys are those of ZooModel.as_sequential().state_dict(), e.g. '0.0.weight')"
        )
    wrong = [
        f"{key}: expected {tuple(expected[key].shape)}, got {tuple(state[key].shape)}"
        for key in sorted(expected)
        if expected[key].shape != state[key].shape
    ]
    if wrong:
        raise ConfigError(f"weights file {str(path)!r} has tensors of the wrong shape: {_shown(wrong)}")
    sequential.load_state_dict(state, strict=True)


def _by_unit_index(
    model: ZooModel, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]
) -> Mapping[str, torch.Tensor]:
    """Keys ``"<unit name>.…"`` (a user's named ``nn.Sequential`` saved with ``state_dict()``) renamed to
    ``"<unit index>.…"``; other state dicts unchanged."""
    if set(state) == set(expected):
        return state
    index = {name: str(i) for i, name in enumerate(model.unit_names)}
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        head, dot, rest = key.partition(".")
        if head not in index or not dot:
            return state
        renamed[f"{index[head]}.{rest}"] = value
    return renamed if set(renamed) == set(expected) else state


def _shown(items: list[str]) -> str:
    head = items[:_MAX_KEYS_SHOWN]
    more = f" … (+{len(items) - len(head)} more)" if len(items) > len(head) else ""
    return f"{head}{more}"


@contextmanager
def seeded(seed: int | None) -> Iterator[None]:
    """Run the block with torch's CPU RNG seeded by ``seed`` and restore the global state afterwards
    (``None``: draw from the global RNG as it is)."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _mlp(k: int, size: int | None, ch: int | None, feat: int | None, norm: str) -> ZooModel:
    return mlp.build(num_classes=k, in_features=feat, input_size=size, in_channels=ch)


def _mnistnet(k: int, size: int | None, ch: int | None, feat: int | None, norm: str) -> ZooModel:
    return mnistnet.build(num_classes=k, input_size=size, in_channels=ch)


def _convnet(k: int, size: int | None, ch: int | None, feat: int | None, norm: str) -> ZooModel:
    return convnet.build(num_classes=k, input_size=size, in_channels=ch)


def _resnet18(k: int, size: int | None, ch: int | None, feat: int | None, norm: str) -> ZooModel:
    return resnet.build(num_classes=k, input_size=size, in_channels=ch, norm=norm)


def _mobilenet(k: int, size: int | None, ch: int | None, feat: int | None, norm: str) -> ZooModel:
    return mobilenet.build(num_classes=k, input_size=size, in_channels=ch, norm=norm)


_BUILDERS: Mapping[str, Callable[[int, int | None, int | None, int | None, str], ZooModel]] = {
    "mlp": _mlp,
    "mnistnet": _mnistnet,
    "convnet": _convnet,
    "resnet18": _resnet18,
    "mobilenet": _mobilenet,
}
assert tuple(_BUILDERS) == MODEL_NAMES
