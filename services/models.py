"""Which model a command builds: a zoo name, or the user's own ``package.module:factory``.

    build_model_for("mnistnet", input_shape=(1, 28, 28), num_classes=10)
    build_model_for("examples.custom_cnn:build", input_shape=(1, 28, 28), num_classes=10)

A factory spec names a module to import and a callable in it (``module:attr``, ``attr`` may be dotted),
as uvicorn and gunicorn name applications. The current directory is put first on ``sys.path`` for the
import (as ``python -m`` does), so ``examples.custom_cnn:build`` works from the repository root and a
user's ``mypkg.models:build`` from their project's root or once installed. The callable's contract is
:mod:`ferret_core.zoo.custom`'s: it returns an ``nn.Sequential`` or a list of units and may take
``input_shape`` and ``num_classes`` keywords. Importing runs the user's code: only name modules you trust.
Weights load with ``torch.load(weights_only=True)`` (:func:`ferret_core.zoo.load_weights`).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from ferret_core.errors import ConfigError
from ferret_core.zoo import MODEL_NAMES, ZooModel, build_model, load_weights, model_from_factory

MODEL_HELP = (
    f"a zoo model ({', '.join(MODEL_NAMES)}) or your own package.module:factory returning an nn.Sequential "
    "or a list of units (docs/your-model.md)"
)
_IDENTIFIERS = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
_FACTORY = re.compile(rf"^({_IDENTIFIERS}):({_IDENTIFIERS})$")
_SHAPE = re.compile(r"^\s*\d+(\s*[,x]\s*\d+)*\s*$")


def is_factory(spec: str) -> bool:
    """Whether ``spec`` names a factory (``module:attr``) rather than a zoo model."""
    return ":" in spec


def check_model_spec(spec: str) -> str:
    """``spec`` when it is a zoo name or a well-formed ``module:attr``; else :class:`ConfigError`."""
    if spec in MODEL_NAMES or _FACTORY.match(spec):
        return spec
    raise ConfigError(
        f"invalid model {spec!r}: expected one of {', '.join(MODEL_NAMES)} or package.module:factory "
        "(e.g. examples.custom_cnn:build)"
    )


def model_spec_type(text: str) -> str:
    """argparse type of ``--model``."""
    try:
        return check_model_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_shape(text: str) -> tuple[int, ...]:
    """``"1,28,28"`` or ``"1x28x28"`` → ``(1, 28, 28)`` (per sample, no batch dimension)."""
    if not _SHAPE.match(text) or any(int(v) < 1 for v in re.split(r"[,x]", text)):
        raise ValueError(
            f"invalid input shape {text!r}: expected positive integers separated by ',' or 'x', per sample "
            "without the batch dimension (e.g. 1,28,28 for MNIST, 3,32,32 for CIFAR-10, 64 for flat features)"
        )
    return tuple(int(v) for v in re.split(r"[,x]", text))


def shape_type(text: str) -> tuple[int, ...]:
    """argparse type of ``--input-shape``."""
    try:
        return parse_shape(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_factory(spec: str) -> Callable[..., object]:
    """Import ``module`` and return its attribute ``attr`` for ``spec = "module:attr"``."""
    match = _FACTORY.match(check_model_spec(spec))
    if match is None:
        raise ConfigError(f"{spec!r} is a zoo model name, not a package.module:factory")
    module_name, attr = match.groups()
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"model {spec!r}: cannot import {module_name!r} ({exc}); run from the folder that holds the "
            f"package (now {cwd}), install it (pip install -e .), or add its folder to PYTHONPATH"
        ) from exc
    except Exception as exc:  # the user's module failed while importing
        raise ConfigError(f"model {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    target: object = module
    for part in attr.split("."):
        if not hasattr(target, part):
            public = sorted(
                n
                for n, v in vars(module).items()
                if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module_name
            )
            raise ConfigError(
                f"model {spec!r}: module {module_name!r} has no attribute {attr!r}; its callables: {public[:12]}"
            )
        target = getattr(target, part)
    if not callable(target):
        raise ConfigError(f"model {spec!r}: {attr!r} is a {type(target).__name__}, expected a callable factory")
    return target


def zoo_shape_arguments(name: str, input_shape: Sequence[int]) -> dict[str, int]:
    """The zoo's keyword arguments for a per-sample input shape: images (C, H, H), flat vectors (F,)."""
    shape = tuple(input_shape)
    if len(shape) == 3:
        if shape[1] != shape[2]:
            raise ConfigError(f"zoo model {name!r} takes square images; got input shape {shape}")
        return {"input_size": shape[1], "in_channels": shape[0]}
    if len(shape) == 1:
        if name != "mlp":
            raise ConfigError(f"zoo model {name!r} takes images (C, H, W); got flat input {shape}; use mlp")
        return {"in_features": shape[0]}
    raise ConfigError(f"input shape {shape} is neither an image (C, H, W) nor a flat vector (F,)")


def build_model_for(
    spec: str,
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int | None = 0,
    weights: str | Path | None = None,
) -> ZooModel:
    """The model ``spec`` names (zoo or factory) for samples of ``input_shape`` and ``num_classes`` classes,
    seeded, with ``weights`` (a state-dict file) loaded when given."""
    if not is_factory(spec):
        check_model_spec(spec)
        shape = zoo_shape_arguments(spec, input_shape)
        return build_model(
            spec,
            num_classes=num_classes,
            input_size=shape.get("input_size"),
            in_channels=shape.get("in_channels"),
            in_features=shape.get("in_features"),
            seed=seed,
            weights=weights,
        )
    factory = load_factory(spec)
    model = model_from_factory(spec, factory, input_shape=input_shape, num_classes=num_classes, seed=seed)
    if weights is not None:
        load_weights(model, weights)
    return model
