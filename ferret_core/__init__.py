"""Ferret's pure core: profiles, cost model, planner, engine and metrics (torch + numpy only)."""

from ferret_core.errors import FerretError, InfeasibleBudgetError
from ferret_core.plan import Partition, Plan, WorkerConfig
from ferret_core.profile import LayerProfile, ModelProfile

__all__ = [
    "FerretError",
    "InfeasibleBudgetError",
    "LayerProfile",
    "ModelProfile",
    "Partition",
    "Plan",
    "WorkerConfig",
]
