"""Executors as OS processes: a plan's (worker, stage) executors in parallel over a master in shared
memory (:class:`ProcessClock`), with version slots and reader counts in place of Python-owned versions,
a shared delta ring per stage for Iter-Fisher (:mod:`.deltas`), and torch.distributed (gloo) between a
worker's stages."""

from ferret_core.engine.processes.clock import ProcessClock
from ferret_core.engine.processes.settings import ProcessSettings, ProcessUsage
from ferret_core.engine.processes.slots import SharedStageVersions, slots_needed

__all__ = ["ProcessClock", "ProcessSettings", "ProcessUsage", "SharedStageVersions", "slots_needed"]
