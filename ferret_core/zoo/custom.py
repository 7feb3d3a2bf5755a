"""The user's own model as a :class:`ZooModel`: from a factory callable or from what it returned.

A factory returns an ``nn.Sequential`` (its children become the units, in order; child names become
unit names) or a list/tuple of modules (the units). A unit is the granularity at which the partitioner
may cut (Alg. 3's "layers"): it maps one tensor to one tensor, so a block with a skip connection must be
one unit. The factory is called with the keyword arguments its signature accepts among ``input_shape``
(per sample, no batch dimension) and ``num_classes``, inside a seeded RNG, so the same seed gives the
same initial weights.

Importing the factory from a ``package.module:factory`` string is the services' job
(:mod:`services.models`): the core takes the callable.

A dry forward of one random sample, with every unit in eval mode (no BatchNorm statistics updated) and
no autograd, checks that each unit returns one tensor and that the output is ``(1, num_classes)``; a
failure names the unit and the shapes, so a wrong ``input_shape`` is reported before any profiling.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import torch
from torch import nn

from ferret_core.errors import ConfigError
from ferret_core.zoo.base import ZooModel, check_positive
from ferret_core.zoo.model_registry import seeded


def model_from_factory(
    name: str,
    factory: Callable[..., object],
    *,
    input_shape: Sequence[int],
    num_classes: int,
    seed: int | None = 0,
) -> ZooModel:
    """Call ``factory`` (see the module docstring) and wrap what it returns with :func:`model_from_units`."""
    shape = _check_shape(name, input_shape)
    check_positive(num_classes=num_classes)
    offered: dict[str, object] = {"input_shape": shape, "num_classes": num_classes}
    kwargs = {key: value for key, value in offered.items() if _accepts(factory, key)}
    with seeded(seed):
        try:
            built = factory(**kwargs)
        except Exception as exc:  # the user's code: say which call failed, keep the cause
            called = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            failure = f"{type(exc).__name__}: {exc}"
            raise ConfigError(f"model {name!r}: calling the factory({called}) failed: {failure}") from exc
    return model_from_units(name, built, input_shape=shape, num_classes=num_classes)


def model_from_units(name: str, built: object, *, input_shape: Sequence[int], num_classes: int) -> ZooModel:
    """A :class:`ZooModel` from an ``nn.Sequential`` or a sequence of modules, checked by a dry forward."""
    shape = _check_shape(name, input_shape)
    check_positive(num_classes=num_classes)
    if isinstance(built, nn.Sequential):
        named = list(built.named_children())
        units = tuple(module for _, module in named)
        names = tuple(key if not key.isdigit() else f"{type(m).__name__.lower()}{key}" for key, m in named)
    elif isinstance(built, (list, tuple)) and all(isinstance(m, nn.Module) for m in built):
        units = tuple(built)
        names = tuple(f"{type(m).__name__.lower()}{i}" for i, m in enumerate(units))
    else:
        raise ConfigError(
            f"model {name!r}: the factory returned {type(built).__name__}; expected an nn.Sequential or a list "
            "of nn.Module units (the points where the pipeline may cut the model); wrap a custom nn.Module's "
            "parts in nn.Sequential, keeping each block with a skip connection as one unit"
        )
    if not units:
        raise ConfigError(f"model {name!r}: the factory returned no units; a model needs at least one")
    model = ZooModel(name, units, shape, num_classes, unit_names=names)
    check_forward(model)
    return model


def check_forward(model: ZooModel) -> None:
    """One random sample through every unit (eval mode, no grad): one tensor each, ``(1, num_classes)`` out."""
    x = torch.randn((1, *model.input_shape), generator=torch.Generator().manual_seed(0))
    modes = [unit.training for unit in model.units]
    try:
        with torch.no_grad():
            for index, (unit_name, unit) in enumerate(zip(model.unit_names, model.units, strict=True)):
                unit.eval()
                try:
                    out = unit(x)
                except Exception as exc:
                    raise ConfigError(
                        f"model {model.name!r}: unit {index} ({unit_name}) failed on input {tuple(x.shape)}: {exc}; "
                        f"check the input shape {model.input_shape} (per sample, no batch dimension)"
                    ) from exc
                if not isinstance(out, torch.Tensor):
                    raise ConfigError(
                        f"model {model.name!r}: unit {index} ({unit_name}) returned {type(out).__name__}; each "
                        "unit must return one tensor (merge the modules that pass several into one unit)"
                    )
                x = out
    finally:
        for unit, mode in zip(model.units, modes, strict=True):
            unit.train(mode)
    if tuple(x.shape) != (1, model.num_classes):
        raise ConfigError(
            f"model {model.name!r}: output for one sample is {tuple(x.shape)}, expected (1, {model.num_classes}) "
            "(batch, num_classes): the last unit must return one logit per class"
        )


def _check_shape(name: str, input_shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(input_shape)
    if not shape or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in shape):
        raise ConfigError(
            f"model {name!r}: input shape must be positive integers per sample (e.g. (1, 28, 28) or (64,)), "
            f"got {input_shape!r}"
        )
    return shape


def _accepts(factory: Callable[..., object], keyword: str) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == keyword and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )
