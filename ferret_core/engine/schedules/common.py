"""What every pipeline schedule shares: Ferret's plan as the starting point, and a plan of its own.

Every schedule runs on the partition L* of Ferret's plan and, as the paper shares L* and C* between all
pipeline strategies (appendix, Hyper-parameters), on its N worker slots: the N·P executors Ferret uses.
Ferret's own techniques T2–T4 (accumulation, omission, worker removal) do not carry over — every slot
is live and back-propagates every item — but a slot's recomputation (T1, activation checkpointing,
which every compared system offers) does. The schedule's plan keeps Ferret's timing fields and carries
the schedule's planned bytes (:mod:`ferret_core.planning.schedule_memory`), so results report them as
``planned_bytes``.
"""

from __future__ import annotations

import dataclasses

from ferret_core.engine.policies import Policy, PolicySetup
from ferret_core.errors import ConfigError
from ferret_core.plan import Plan, WorkerConfig
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.planning.schedule_memory import ScheduleShape, schedule_memory
from ferret_core.profile import ModelProfile


def micro_batches(plan: Plan, flush_every: int | None) -> int:
    """m: ``flush_every``, or the pipeline depth P when ``None`` (the default m = P, docs/schedules.md)."""
    m = plan.num_stages if flush_every is None else flush_every
    if m < 1:
        raise ConfigError(f"flush_every (m) must be >= 1 micro-batch, got {m}")
    return m


def check_units(plan: Plan, model: str, num_units: int) -> None:
    if plan.partition.num_units != num_units:
        raise ConfigError(
            f"the plan partitions {plan.partition.num_units} units, the model {model!r} has {num_units}; "
            "plan with this model's profile"
        )


def rows_from_slots(plan: Plan, rows_per_slot: int = 1, accumulation: int = 1) -> tuple[WorkerConfig, ...]:
    """``rows_per_slot`` live rows for each of the plan's S worker slots, each with the slot's
    recomputation, c^a = ``accumulation`` at every stage and no omission. Row n = r·S + s is the r-th row
    of slot s, so item i (dispatched to row i mod R) goes to slot i mod S, as with one row per slot."""
    p = plan.num_stages
    slots = len(plan.workers)
    return tuple(
        WorkerConfig(
            r * slots + s,
            live=True,
            recompute=slot.recompute,
            accumulation=(accumulation,) * p,
            omission=(0,) * p,
        )
        for r in range(rows_per_slot)
        for s, slot in enumerate(plan.workers)
    )


def schedule_plan(
    plan: Plan,
    method: str,
    workers: tuple[WorkerConfig, ...],
    shape: ScheduleShape,
    profile: ModelProfile | None,
    memory: MemorySettings,
) -> tuple[Plan, bool]:
    """The plan a schedule executes (Ferret's L* and timing, the schedule's rows), with its planned bytes
    when a profile is given; the flag says whether bytes were planned."""
    breakdown = (
        {} if profile is None else schedule_memory(profile, plan.partition, shape, memory, plan.arrival_interval)
    )
    return (
        dataclasses.replace(
            plan,
            workers=workers,
            planned_bytes=sum(breakdown.values()),
            memory_model=f"schedule:{method}",
            memory_breakdown=breakdown,
            steps=(),
            recompute_note=f"{method} on Ferret's partition and worker slots",
        ),
        profile is not None,
    )


class WithPlannedBytes:
    """A sequential method (Oracle, 1-Skip: one worker, one stage holding the whole model) reported with
    planned bytes from the same byte model as the schedules — an asynchronous pipeline of one worker
    and one stage: the master (its own replica), one item's activations, one gradient — so every
    method reports measured *and* planned memory."""

    def __init__(self, policy: Policy, profile: ModelProfile | None, memory: MemorySettings) -> None:
        self.policy = policy
        self.profile = profile
        self.memory = memory

    @property
    def name(self) -> str:
        return self.policy.name

    def setup(self, model: str, num_units: int, arrival_interval: float) -> PolicySetup:
        setup = self.policy.setup(model, num_units, arrival_interval)
        if self.profile is None:
            return setup
        shape = ScheduleShape(False, setup.plan.workers)
        breakdown = schedule_memory(self.profile, setup.plan.partition, shape, self.memory, arrival_interval)
        planned = dataclasses.replace(
            setup.plan,
            planned_bytes=sum(breakdown.values()),
            memory_model=f"schedule:{self.name}",
            memory_breakdown=breakdown,
        )
        return dataclasses.replace(setup, planned=planned)
