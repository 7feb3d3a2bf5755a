"""Every training method by name (DESIGN §4 "Names"; STYLE lesson 10: chosen from a registry).

One :class:`Method` line per method: its name, how to build its policy, whether it executes a planner's
plan (Ferret, and the pipeline schedules, which run on Ferret's partition and worker slots), and the
paper it follows. The CLI, the service's config and the generic check suite read :data:`METHODS`; to add
a method, add its line here (and its options to :class:`MethodOptions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from ferret_core.engine.buffering import BufferingPolicy, BufferingSettings
from ferret_core.engine.policies import FerretPolicy, OneSkip, Oracle, Policy
from ferret_core.engine.schedules import Dapple, Hanayo, PipeDream, PipeDream2BW, ZeroBubble
from ferret_core.engine.schedules.common import WithPlannedBytes
from ferret_core.engine.steps import NO_FOOTPRINT, Footprint
from ferret_core.errors import ConfigError
from ferret_core.plan import Partition, Plan, WorkerConfig
from ferret_core.planning.memory_model import MemorySettings
from ferret_core.profile import ModelProfile


@dataclass(frozen=True)
class MethodOptions:
    """Options of the methods (each uses those it names, ignores the rest).

    ``wait_slots``: items that may wait for stage 0 per worker (Ferret and the pipeline schedules).
    ``flush_every``: m, micro-batches per pipeline row between updates (DAPPLE, ZB, Hanayo's flush
    groups; PipeDream-2BW's accumulation); ``None``: the pipeline depth P. ``input_share``: the part of
    t̂^b zero bubble's B takes. ``memory``: how the schedules count planned bytes — pass the compensator
    the run uses. ``buffering``: N, B and Camel's buffer of the buffering methods (Random-N, Last-N,
    Camel); ``budget``: the bytes they fit N to (``None``: N as given); ``footprint``: what the run's OCL
    algorithm adds to their planned bytes (:mod:`ferret_core.engine.buffering`).
    """

    wait_slots: int = 1
    flush_every: int | None = None
    input_share: float = 0.5
    memory: MemorySettings = field(default_factory=lambda: MemorySettings(variant="engine", compensator="none"))
    buffering: BufferingSettings = field(default_factory=BufferingSettings)
    budget: int | None = None
    footprint: Footprint = NO_FOOTPRINT


Build = Callable[[Plan | None, ModelProfile | None, MethodOptions], Policy]


@dataclass(frozen=True)
class Method:
    """A registered method: ``build(plan, profile, options)`` makes its policy."""

    name: str
    build: Build
    needs_plan: bool  # executes (or starts from) the planner's plan
    follows: str  # the paper or reference it follows
    compensates: bool = False  # applies the run's compensator by default (else only when asked)


def _plan(plan: Plan | None, name: str) -> Plan:
    if plan is None:
        raise ConfigError(
            f"method {name!r} runs on a planner's plan (Ferret's partition L* and worker slots): pass plan= "
            "(from ferret_core.planning.planner.Planner)"
        )
    return plan


def _schedule(o: MethodOptions, profile: ModelProfile | None) -> dict[str, object]:
    return {"flush_every": o.flush_every, "wait_slots": o.wait_slots, "input_share": o.input_share,
            "profile": profile, "memory": o.memory}


def _async(o: MethodOptions, profile: ModelProfile | None) -> dict[str, object]:
    return {"wait_slots": o.wait_slots, "profile": profile, "memory": o.memory}


def _buffering(name: str, profile: ModelProfile | None, o: MethodOptions) -> Policy:
    return BufferingPolicy(name, o.buffering, profile=profile, budget=o.budget, footprint=o.footprint)


_LIST: tuple[Method, ...] = (
    Method("oracle", lambda plan, profile, o: WithPlannedBytes(Oracle(), profile, o.memory), False,
           "Ghunaim et al., ICCV 2023 (no compute limit)"),
    Method("1-skip", lambda plan, profile, o: WithPlannedBytes(OneSkip(), profile, o.memory), False,
           "Ghunaim et al., ICCV 2023"),
    Method("random-n", lambda plan, profile, o: _buffering("random-n", profile, o), False,
           "Ghunaim et al., ICCV 2023 (B-Skip)"),
    Method("last-n", lambda plan, profile, o: _buffering("last-n", profile, o), False,
           "Ghunaim et al., ICCV 2023 (B-Skip)"),
    Method("camel", lambda plan, profile, o: _buffering("camel", profile, o), False,
           "Li, Shen, Chen, SIGMOD 2022 (simplified, engine/coreset.py)"),
    Method("dapple", lambda plan, profile, o: Dapple(_plan(plan, "dapple"), **_schedule(o, profile)),  # type: ignore[arg-type]
           True, "Fan et al., PPoPP 2021"),
    Method("zb", lambda plan, profile, o: ZeroBubble(_plan(plan, "zb"), **_schedule(o, profile)),  # type: ignore[arg-type]
           True, "Qi et al., ICLR 2024 (ZB-H1)"),
    Method("hanayo-1w", lambda plan, profile, o: Hanayo(_plan(plan, "hanayo-1w"), 1, **_schedule(o, profile)),
           True, "Liu et al., SC 2023 (1 wave)"),
    Method("hanayo-2w", lambda plan, profile, o: Hanayo(_plan(plan, "hanayo-2w"), 2, **_schedule(o, profile)),
           True, "Liu et al., SC 2023 (2 waves)"),
    Method("hanayo-3w", lambda plan, profile, o: Hanayo(_plan(plan, "hanayo-3w"), 3, **_schedule(o, profile)),
           True, "Liu et al., SC 2023 (3 waves)"),
    Method("pipedream", lambda plan, profile, o: PipeDream(_plan(plan, "pipedream"), **_async(o, profile)),  # type: ignore[arg-type]
           True, "Narayanan et al., SOSP 2019"),
    Method("pipedream-2bw",
           lambda plan, profile, o: PipeDream2BW(_plan(plan, "pipedream-2bw"), flush_every=o.flush_every,
                                                 **_async(o, profile)),
           True, "Narayanan et al., ICML 2021"),
    Method("ferret", lambda plan, profile, o: FerretPolicy(_plan(plan, "ferret"), wait_slots=o.wait_slots),
           True, "Zhou et al., CVPR 2025", compensates=True),
)

METHODS: dict[str, Method] = {m.name: m for m in _LIST}
METHOD_NAMES: tuple[str, ...] = tuple(METHODS)


def method(name: str) -> Method:
    """The registered method ``name``, or a :class:`ConfigError` listing the names."""
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}: expected one of {', '.join(METHOD_NAMES)}") from None


def make_policy(
    name: str,
    plan: Plan | None = None,
    *,
    profile: ModelProfile | None = None,
    options: MethodOptions | None = None,
) -> Policy:
    """The policy of method ``name``; methods with ``needs_plan`` need ``plan``, and report planned bytes
    of a schedule only with the model's ``profile``."""
    return method(name).build(plan, profile, options or MethodOptions())


def layout_plan(plan: Plan, partition: Partition, num_workers: int, *, recompute: bool = False) -> Plan:
    """``plan`` moved onto another layout — ``partition`` and ``num_workers`` plain worker slots (live, no
    T1–T4 unless ``recompute``) — for running a pipeline schedule on a partition/N of your choice (an
    ablation beside the paper's, which shares Ferret's L* and N). The cost model's figures of ``plan``
    no longer apply: predicted bytes become 0 and its steps are dropped; a schedule given the profile
    plans its own bytes. Not for Ferret, whose techniques are what its planner chose."""
    if num_workers < 1:
        raise ConfigError(f"a layout needs at least one worker slot, got num_workers={num_workers}")
    if partition.num_units != plan.partition.num_units:
        raise ConfigError(
            f"partition over {partition.num_units} units cannot drive a model of {plan.partition.num_units} units"
        )
    stages = partition.num_stages
    workers = tuple(
        WorkerConfig(n, live=True, recompute=recompute, accumulation=(1,) * stages, omission=(0,) * stages)
        for n in range(num_workers)
    )
    return dataclasses.replace(
        plan, partition=partition, workers=workers, planned_bytes=0, memory_breakdown={}, steps=(),
        recompute_note=f"layout chosen by hand: {stages} stages, {num_workers} slots",
    )
