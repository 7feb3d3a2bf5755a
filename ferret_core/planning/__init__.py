"""Ferret's planner (paper §"Planner", DESIGN §3): profile the layers (``profiler``), enumerate partitions
(``partitioning``), estimate each configuration's adaptation rate R_F (``cost_model``) and memory M_F
(``memory_model``, with ``residency`` replaying a worker's schedule and ``admission_queue`` sizing what
waits), and search the configurations greedily under a budget (``search``, ``planner``). The compared
pipeline schedules' planned bytes are ``schedule_memory``.

Planning reads profiles and writes :class:`~ferret_core.plan.Plan`; it imports the schedule package (to
replay a worker) and nothing of the engine that executes its plans.
"""

from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.planning.planner import Planner, PlannerSettings, PlanOption

__all__ = ["MemoryModel", "MemorySettings", "PlanOption", "Planner", "PlannerSettings"]
