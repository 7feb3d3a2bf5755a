"""What a process clock is configured with, what it reports per process, and which setups it runs."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.policies import PolicySetup
from ferret_core.errors import ConfigError, NotImplementedFeatureError


@dataclass(frozen=True)
class ProcessSettings:
    """``lr``: the master's plain SGD. ``compensator``: a registry name (see the module docstring for
    those that run here). ``threads``: torch threads per executor process. ``flush_denormal``: executors
    flush denormal floats to zero (``torch.set_flush_denormal``: much faster where weights or gradients
    get tiny; results then differ from a process that keeps them). ``keep_trace``: keep every trace event
    (validation). ``top_k``: classes an :class:`Arrival` reports. ``queue_slots``: items that may wait per
    worker before an arrival is skipped ``busy`` (0: only an idle worker takes one; ``None``: the schedule
    rules' ``wait_slots``). ``max_step_ratio``: the norm guard's bound on each SGD step relative to the stage's
    weight norm (:mod:`ferret_core.engine.step_guard`; None: unbounded)."""

    lr: float = 1e-3
    compensator: str = "none"
    compensator_settings: CompensatorSettings = field(default_factory=CompensatorSettings)
    threads: int = 1
    flush_denormal: bool = False
    keep_trace: bool = True
    top_k: int = 1
    queue_slots: int | None = None
    max_step_ratio: float | None = None


@dataclass(frozen=True)
class ProcessUsage:
    """One executor process's CPU seconds and peak resident bytes (its own, shared segments included
    where it touched them), read when asked."""

    worker: int
    stage: int
    pid: int
    cpu_seconds: float
    max_rss_bytes: int


def check_supported(setup: PolicySetup, settings: ProcessSettings) -> None:
    """What this version of the process executors runs (see the module docstring)."""
    if setup.feeder is not None or setup.pipeline_type is not None or setup.instant:
        raise NotImplementedFeatureError(
            f"method {setup.method!r} is not run on process executors (buffering methods, flushing schedules "
            "and instant methods run on the wall clock)"
        )
    if settings.queue_slots is not None and settings.queue_slots < 0:
        raise ConfigError(f"queue_slots must be >= 0 (or None: the rules' wait_slots), got {settings.queue_slots}")
    if settings.threads < 1:
        raise ConfigError(f"threads per executor must be >= 1, got {settings.threads}")
    compensator = make_compensator(settings.compensator, [torch.zeros(1)], settings.compensator_settings, 0)
    if compensator.needs_deltas:
        raise NotImplementedFeatureError(
            f"compensator {settings.compensator!r} observes every master update, which executor processes do "
            "not share; use none, step-aware, fisher or iter-fisher-lean on process executors"
        )
