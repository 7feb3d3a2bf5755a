"""OCL algorithms by name (DESIGN §4 "Names"): the registry the CLI and the check suite read."""

from __future__ import annotations

from collections.abc import Callable

from ferret_core.engine.steps import Algorithm, PlainSteps
from ferret_core.errors import ConfigError
from ferret_core.ocl.algorithms import (
    ExperienceReplay,
    LearningWithoutForgetting,
    MaximallyInterferedRetrieval,
    MemoryAwareSynapses,
)
from ferret_core.ocl.settings import AlgorithmSettings

_FACTORIES: dict[str, Callable[[AlgorithmSettings], Algorithm]] = {
    "vanilla": lambda settings: PlainSteps(),
    "er": ExperienceReplay,
    "mir": MaximallyInterferedRetrieval,
    "lwf": LearningWithoutForgetting,
    "mas": MemoryAwareSynapses,
}
ALGORITHM_NAMES: tuple[str, ...] = tuple(_FACTORIES)


def make_algorithm(name: str, settings: AlgorithmSettings | None = None) -> Algorithm:
    """A fresh algorithm called ``name`` (one of :data:`ALGORITHM_NAMES`); one per engine run."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown OCL algorithm {name!r}: expected one of {', '.join(ALGORITHM_NAMES)}")
    return factory(settings or AlgorithmSettings())
