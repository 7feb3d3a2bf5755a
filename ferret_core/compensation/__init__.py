"""Stale-gradient compensators, one per pipeline stage (paper §"Iterative Gradient Compensation",
DESIGN §3.3, §3.4): ``none``, ``step-aware``, ``gap-aware``, ``fisher``, ``iter-fisher``, ``iter-fisher-cf``,
``iter-fisher-lean`` (Alg. 1 in one step from the stash, no delta ring).
"""

from ferret_core.compensation.base import CompensatorSettings, StageCompensator
from ferret_core.compensation.compensator_registry import COMPENSATOR_NAMES, make_compensator
from ferret_core.compensation.ring import DeltaRing

__all__ = [
    "COMPENSATOR_NAMES",
    "CompensatorSettings",
    "DeltaRing",
    "StageCompensator",
    "make_compensator",
]
