"""Training methods as policies over the one engine (DESIGN §2: every compared method is a policy, not a
separate training loop).

A policy turns (model size, arrival interval) into a :class:`PolicySetup`: the plan the engine executes
(partition and worker configuration), the :class:`~ferret_core.schedule.scheduler.ScheduleRules` the
scheduler consults (admission slots, T3 back-propagation, in-flight caps), whether actions take time, and
the planner's plan whose predicted memory is reported (``None`` when no cost model applies).

Random-N / Last-N B-Skip and Camel (:mod:`ferret_core.engine.buffering`) are a sequential plan with
1-Skip's rules plus a feeder that buffers arrivals and hands over mini-batches. The pipeline schedules
live in :mod:`ferret_core.engine.schedules`: PipeDream and PipeDream-2BW are plans executed by this
engine as it is (c^a = 1, resp. c^a = m), DAPPLE / ZB / Hanayo bring their own scheduler and pipeline
(``PolicySetup.pipeline_type``: a flush barrier, the B/W split, shared devices). Every method is
registered by name in :mod:`ferret_core.engine.method_registry`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.steps import Feeder
from ferret_core.errors import ConfigError
from ferret_core.plan import Partition, Plan, WorkerConfig
from ferret_core.schedule.scheduler import PlanRules, ScheduleRules


@dataclass(frozen=True)
class PolicySetup:
    """What the engine needs from a policy."""

    method: str
    plan: Plan
    rules: ScheduleRules
    instant: bool  # every action takes no time (the clock still orders them)
    planned: Plan | None  # the planner's plan (its predicted bytes are reported), None without one
    pipeline_type: type[Pipeline] | None = None  # a schedule's own pipeline; None: the engine's
    feeder: Feeder | None = None  # a buffering method's arrival buffer (ferret_core.engine.buffering)


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup: ...


def sequential_plan(model: str, num_units: int, arrival_interval: float) -> Plan:
    """One worker, one stage holding every unit, no T1–T4: sequential training. Its cost fields are
    zero: no cost model is attached to it (``PolicySetup.planned`` is ``None``)."""
    return Plan(
        model=model,
        partition=Partition((0, num_units)),
        workers=(WorkerConfig(0, live=True, recompute=False, accumulation=(1,), omission=(0,)),),
        arrival_interval=arrival_interval,
        decay=0.0,
        stage_forward_time=0.0,
        stage_backward_time=0.0,
        adaptation_rate=0.0,
        planned_bytes=0,
        paper_memory_elements=0,
        min_feasible_bytes=0,
        budget_bytes=None,
        memory_model="none",
        dtype="float32",
    )


class Oracle:
    """Oracle (the paper's upper reference, "Oracle" column of its tables; Ghunaim et al., ICCV 2023,
    "Real-Time Evaluation in Online Continual Learning": the model that is not constrained by compute):
    every item is trained, sequentially, on the whole model, before the next one arrives, whatever the
    time it takes — one worker, one stage, actions take no time."""

    name = "oracle"

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        plan = sequential_plan(model, num_units, arrival_interval)
        return PolicySetup(self.name, plan, PlanRules(plan, wait_slots=1), instant=True, planned=None)


class OneSkip:
    """1-Skip (Ghunaim et al., ICCV 2023, "Real-Time Evaluation in Online Continual Learning", the
    paper's baseline B): one sequential trainer on the whole model; an item is trained only if the
    trainer is free when it arrives (it never waits), else it is skipped as ``busy``. Every item is
    still predicted at arrival."""

    name = "1-skip"

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        plan = sequential_plan(model, num_units, arrival_interval)
        return PolicySetup(self.name, plan, PlanRules(plan, wait_slots=0), instant=False, planned=None)


class FerretPolicy:
    """Ferret (Zhou et al., CVPR 2025, §"Fine-grained Pipeline Parallelism"): asynchronous 1F1B pipelines
    of N workers on interleaved items (i ≡ c_n^d mod N) executing a planner's :class:`Plan` with T1–T4,
    one waiting slot per worker."""

    name = "ferret"

    def __init__(self, plan: Plan, *, wait_slots: int = 1) -> None:
        self.plan = plan
        self.wait_slots = wait_slots

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        if self.plan.partition.num_units != num_units:
            raise ConfigError(
                f"the plan partitions {self.plan.partition.num_units} units, the model {model!r} has {num_units}"
            )
        rules = PlanRules(self.plan, wait_slots=self.wait_slots)
        return PolicySetup(self.name, self.plan, rules, instant=False, planned=self.plan)
