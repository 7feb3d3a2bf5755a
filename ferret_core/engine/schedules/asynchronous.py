"""Asynchronous pipeline schedules as policies: PipeDream and PipeDream-2BW.

Both are plans the engine executes as it is (asynchronous 1F1B, at most P − j items in flight at stage
j, weight stashing, its pipeline and scheduler), on Ferret's partition L* and its N worker slots — N
asynchronous pipelines that share the master, as Ferret's workers do — without T2–T4 and without
compensation unless asked (the paper's Table "pipeline-ablation"). Admission as Ferret's (one waiting
item per worker by default). Their staleness bound is the plan's (:mod:`ferret_core.staleness`).
"""

from __future__ import annotations

from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.schedules.common import check_units, micro_batches, rows_from_slots, schedule_plan
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.schedule_memory import ScheduleShape
from ferret_core.profile import ModelProfile
from ferret_core.schedule.scheduler import PlanRules

_NO_COMPENSATOR = MemorySettings(variant="engine", compensator="none")


class PipeDream:
    """PipeDream (Narayanan et al., "PipeDream: Generalized Pipeline Parallelism for DNN Training", SOSP
    2019; msr-fiddle/pipedream): 1F1B without flushes, weight stashing — an item's backward at a stage
    uses the weights its forward used — and an update after every backward (c^a = 1), so a worker keeps
    one weight version per item in flight at each stage (1 + P−1−j at stage j). Vertical sync is off,
    as in PipeDream's default."""

    name = "pipedream"

    def __init__(
        self,
        plan: Plan,
        *,
        wait_slots: int = 1,
        profile: ModelProfile | None = None,
        memory: MemorySettings = _NO_COMPENSATOR,
    ) -> None:
        self.plan = plan
        self.wait_slots = wait_slots
        self.profile = profile
        self.memory = memory

    def accumulation(self) -> int:
        return 1

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        check_units(self.plan, model, num_units)
        workers = rows_from_slots(self.plan, accumulation=self.accumulation())
        shape = ScheduleShape(False, workers)
        executed, planned = schedule_plan(self.plan, self.name, workers, shape, self.profile, self.memory)
        rules = PlanRules(executed, wait_slots=self.wait_slots)
        return PolicySetup(self.name, executed, rules, instant=False, planned=executed if planned else None)


class PipeDream2BW(PipeDream):
    """PipeDream-2BW (Narayanan et al., "Memory-Efficient Pipeline-Parallel DNN Training", ICML 2021):
    1F1B without flushes, gradients accumulated over m micro-batches (c^a = m, default P) and *double-
    buffered weights*: a stage makes a new version every m backward passes; items in flight keep the
    previous one, new items read the new one, so with m ≥ P − 1 a worker never holds more than two
    versions of a stage (checked by the tests), and an update applies gradients computed on the version
    before it (W(t+1) = W(t) − ν∇f(W(t−1)) once the pipeline is full)."""

    name = "pipedream-2bw"

    def __init__(self, plan: Plan, *, flush_every: int | None = None, **kwargs: object) -> None:
        super().__init__(plan, **kwargs)  # type: ignore[arg-type]
        self.micro_batches = micro_batches(plan, flush_every)
        if self.micro_batches < plan.num_stages - 1:
            raise ConfigError(
                f"pipedream-2bw accumulates m >= P - 1 = {plan.num_stages - 1} micro-batches per update to keep "
                f"two weight versions; got m = {self.micro_batches} (--flush-every)"
            )

    def accumulation(self) -> int:
        return self.micro_batches
