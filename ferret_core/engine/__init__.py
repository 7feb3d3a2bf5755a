"""The streaming engine: N asynchronous 1F1B pipeline workers over P stages with versioned weights,
T1–T4, stale-gradient compensation, a virtual and a wall clock, and independent memory measurement
(paper §"Fine-grained Pipeline Parallelism"; DESIGN §2, §3.13).

Modules, one concept each: ``versions`` (master, replicas, stashes), ``stage_exec`` (one stage's passes
on a given version), ``optim`` (out-of-place SGD), ``pipeline`` (what an action does), ``stage_update``
(accumulation, compensation and the update of a stage's master), ``predictor`` (the masters' predictions
and the algorithm's view of them), ``pipeline_memory`` (a pipeline's memory sources), ``state`` (its
in-flight items and counters), ``virtual_clock``, ``wall_clock`` (executor threads, or the caller's
thread: a facade over ``wall_life``, its threads and first failure, ``wall_executors``, their run loop,
``wall_predictions``, the arrivals' queue and predictions, ``wall_admission``, measured service times and
admission by event time, ``inline_training`` and ``wall_streams``, CUDA streams), ``processes``
(executors as OS processes over a master in shared memory), ``memory_meter``
(measurement), ``trace`` (validator, table, staleness), ``policies`` (Oracle, 1-Skip, Ferret), ``steps``
(what an admitted arrival trains, and the Algorithm / Feeder hooks of OCL algorithms and buffering
methods), ``buffering`` and ``coreset`` (Random-N / Last-N B-Skip, Camel), ``schedules`` (DAPPLE, ZB,
Hanayo, PipeDream, PipeDream-2BW), ``method_registry`` (every method by name), ``result``, ``carry``
(compensator state across a re-plan), ``engine`` (the facade), ``ablation`` (compensators on one fixed
plan: :func:`run_compensators`). The actions and the scheduler that orders them are
:mod:`ferret_core.schedule`; OCL algorithms live in :mod:`ferret_core.ocl`.
"""

from ferret_core.engine.ablation import AblationRun, RunInputs, run_compensators
from ferret_core.engine.engine import EngineSettings, StreamEngine, simulate
from ferret_core.engine.method_registry import METHOD_NAMES, METHODS, MethodOptions, layout_plan, make_policy
from ferret_core.engine.policies import FerretPolicy, OneSkip, Oracle
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.result import EngineStats, SimulationResult
from ferret_core.engine.trace import TraceError, validate_trace
from ferret_core.schedule.actions import Kind, SkipReason, TraceEvent
from ferret_core.schedule.stage_times import StageTimes

__all__ = [
    "METHODS",
    "METHOD_NAMES",
    "AblationRun",
    "EngineSettings",
    "EngineStats",
    "FerretPolicy",
    "Kind",
    "MethodOptions",
    "OneSkip",
    "Oracle",
    "ProcessClock",
    "ProcessSettings",
    "RunInputs",
    "SimulationResult",
    "SkipReason",
    "StageTimes",
    "StreamEngine",
    "TraceError",
    "TraceEvent",
    "layout_plan",
    "make_policy",
    "run_compensators",
    "simulate",
    "validate_trace",
]
