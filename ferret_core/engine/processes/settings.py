"""What a process clock is configured with, what it reports per process, and which setups it runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ferret_core.compensation import CompensatorSettings, StageCompensator, make_compensator
from ferret_core.engine.policies import PolicySetup
from ferret_core.errors import ConfigError, NotImplementedFeatureError


@dataclass(frozen=True)
class ProcessSettings:
    """``lr``: the master's plain SGD. ``compensator``: a registry name (see the module docstring for
    those that run here). ``threads``: torch threads per executor process. ``flush_denormal``: executors
    flush denormal floats to zero (``torch.set_flush_denormal``: much faster where weights or gradients
    get tiny; results then differ from a process that keeps them). ``retain_heap``: executors keep freed memory
in their heap (:func:`ferret_core.engine.heap.retain_freed_memory`: no page faults for the same megabytes
every step; results are unchanged). ``keep_trace``: keep every trace event
    (validation). ``top_k``: classes an :class:`Arrival` reports. ``queue_slots``: items that may wait per
    worker before an arrival is skipped ``busy`` (0: only an idle worker takes one; ``None``: the schedule
    rules' ``wait_slots``). ``max_step_ratio``: the norm guard's bound on each SGD step relative to the stage's
    weight norm (:mod:`ferret_core.engine.step_guard`; None: unbounded). ``record_compensations``: each executor
    keeps the inputs, state and output of its first this-many compensations of a stale gradient
    (:meth:`ProcessClock.compensations`; for tests that check them against the in-process compensator).
    ``measure_memory``: each executor samples what it holds in its process after every action
    (:mod:`ferret_core.engine.memory_meter`; :meth:`ProcessClock.measured_bytes`); off, only the shared
    segments are measured (for a benchmark of what sampling costs)."""

    lr: float = 1e-3
    compensator: str = "none"
    compensator_settings: CompensatorSettings = field(default_factory=CompensatorSettings)
    threads: int = 1
    flush_denormal: bool = False
    retain_heap: bool = True
    keep_trace: bool = True
    top_k: int = 1
    queue_slots: int | None = None
    max_step_ratio: float | None = None
    record_compensations: int = 0
    measure_memory: bool = True


@dataclass(frozen=True)
class CompensationReport:
    """One executor's compensator, read when asked (:meth:`ProcessClock.compensations`): its ``stats()``
    (λ, calls, compensated, truncated, …, plus ``compensate_seconds`` and ``push_seconds``: wall seconds in
    its calls and in pushes to the shared delta ring or folds into the shared average step) and, where
    ``ProcessSettings.record_compensations`` > 0, its first such many compensations of a stale gradient,
    each a dict of ``staleness``, ``grads``, ``theta_then``, ``theta_now``, ``state`` (the compensator's
    ``state_dict()`` before the call: its ring's deltas, λ, v_r, v_a; Gap-Aware's shared C and n as it
    read them) and ``out`` (what it returned)."""

    worker: int
    stage: int
    stats: dict[str, float]
    records: list[dict[str, Any]]


@dataclass(frozen=True)
class ProcessUsage:
    """One executor process's CPU seconds and peak resident bytes (its own, shared segments included
    where it touched them, the interpreter and torch too), read when asked; and what its memory meter
    measured: ``measured_bytes``, the peak of the tensors it held at a sample (after each action), the
    shared version slots, delta rings, average steps and tuning states excluded, with
    ``measured_breakdown`` by source at that peak (``items``: stage inputs, outputs and labels of items in
    flight; ``autograd_saved``: their
    graphs' saved tensors; ``sends``: tensors still held by sends to another stage; ``gradients``: the
    gradient buffer; ``compensator``: its own state), ``memory_samples`` and ``sample_seconds`` (the samples' CPU
    seconds) over ``actions`` F and B actions run (0 where ``ProcessSettings.measure_memory`` is off);
    ``heap_retained``: the process keeps freed memory in its heap (``ProcessSettings.retain_heap`` asked for it
    and the C library is glibc, :mod:`ferret_core.engine.heap`)."""

    worker: int
    stage: int
    pid: int
    cpu_seconds: float
    max_rss_bytes: int
    measured_bytes: int = 0
    measured_breakdown: dict[str, int] = field(default_factory=dict)
    memory_samples: int = 0
    sample_seconds: float = 0.0
    actions: int = 0
    heap_retained: bool = False


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
    if settings.record_compensations < 0:
        raise ConfigError(f"record_compensations must be >= 0, got {settings.record_compensations}")
    compensator = _probe(settings)
    if compensator.needs_deltas and not (compensator.keeps_ring or compensator.keeps_average):
        raise NotImplementedFeatureError(
            f"compensator {settings.compensator!r} folds every master update into state of its own (neither a "
            "delta ring nor a running average), which executor processes do not share; run it on the thread "
            "executors, or choose a compensator that keeps one of those"
        )


def shares_deltas(settings: ProcessSettings) -> bool:
    """Whether the compensator walks the master's deltas (Alg. 1's ring): then every stage that can be
    stale gets a delta ring in shared memory (:mod:`ferret_core.engine.processes.deltas`)."""
    compensator = _probe(settings)
    return compensator.needs_deltas and compensator.keeps_ring


def shares_average(settings: ProcessSettings) -> bool:
    """Whether the compensator folds every master update into a running average (Gap-Aware's C): then
    every stage that can be stale gets one in shared memory (:mod:`ferret_core.engine.processes.average`)."""
    compensator = _probe(settings)
    return compensator.needs_deltas and compensator.keeps_average


def _probe(settings: ProcessSettings) -> StageCompensator:
    """The settings' compensator over one scalar parameter, asked what it keeps (allocates no state)."""
    return make_compensator(settings.compensator, [torch.zeros(1)], settings.compensator_settings, 0)
