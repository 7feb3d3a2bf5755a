"""Compensators chosen by name (STYLE lesson 10): the names the CLI, the trainer and the benchmarks use."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from torch import Tensor

from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.compensation.dc_asgd import DcAsgdAdaptiveCompensator
from ferret_core.compensation.fisher import FisherCompensator
from ferret_core.compensation.iter_fisher import IterFisherClosedFormCompensator, IterFisherCompensator
from ferret_core.compensation.lean import IterFisherLeanCompensator
from ferret_core.compensation.simple import GapAwareCompensator, NoCompensator, StepAwareCompensator
from ferret_core.errors import ConfigError

_Factory = Callable[[Sequence[Tensor], CompensatorSettings, int], StageCompensator]

_FACTORIES: dict[str, _Factory] = {
    "none": lambda params, settings, _capacity: NoCompensator(params, settings),
    "step-aware": lambda params, settings, _capacity: StepAwareCompensator(params, settings),
    "gap-aware": GapAwareCompensator,
    "fisher": lambda params, settings, _capacity: FisherCompensator(params, settings),
    "iter-fisher": IterFisherCompensator,
    "iter-fisher-cf": IterFisherClosedFormCompensator,
    "iter-fisher-lean": IterFisherLeanCompensator,
    "dc-asgd-a": DcAsgdAdaptiveCompensator,
}

COMPENSATOR_NAMES: tuple[str, ...] = (
    "none",
    "step-aware",
    "gap-aware",
    "fisher",
    "iter-fisher",
    "iter-fisher-cf",
    "iter-fisher-lean",
    "dc-asgd-a",
)


def make_compensator(
    name: str,
    params: Sequence[Tensor],
    settings: CompensatorSettings,
    ring_capacity: int,
) -> StageCompensator:
    """A fresh compensator for one stage whose parameters are ``params`` (shapes, dtypes and device of
    the state it allocates; no reference to them is kept). ``ring_capacity`` is the stage's staleness bound
    under the plan (DESIGN §3.13): the number of deltas the iterative compensators keep, and, when it is 0
    (no gradient of the stage is ever stale), the sign that the compensator allocates no per-parameter
    state at all (Iter-Fisher's v_r, v_a, Gap-Aware's C, DC-ASGD-a's MeanSquare: they would never be
    read)."""
    factory = _FACTORIES.get(name)
    if factory is None:
        raise ConfigError(f"unknown compensator {name!r}: expected one of {', '.join(COMPENSATOR_NAMES)}")
    if isinstance(ring_capacity, bool) or not isinstance(ring_capacity, int) or ring_capacity < 0:
        raise ConfigError(f"ring_capacity must be an int >= 0 (the stage's staleness bound), got {ring_capacity!r}")
    return factory(list(params), settings, ring_capacity)
