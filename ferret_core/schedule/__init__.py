"""What runs when: the actions of a pipeline, the one scheduler that orders them, and the plain step and
timing data both clocks and the planner share (pure bookkeeping: no torch, no clock, no threads).

Below both :mod:`ferret_core.planning` (which replays a worker's schedule to size its residency) and
:mod:`ferret_core.engine` (whose clocks ask the scheduler for the next action).
"""

from ferret_core.schedule.actions import Action, Kind, SkipReason, TraceEvent
from ferret_core.schedule.scheduler import PlanRules, Scheduler, ScheduleRules
from ferret_core.schedule.stage_times import StageTimes
from ferret_core.schedule.step_shape import UNIT_STEP, StepShape

__all__ = [
    "UNIT_STEP",
    "Action",
    "Kind",
    "PlanRules",
    "ScheduleRules",
    "Scheduler",
    "SkipReason",
    "StageTimes",
    "StepShape",
    "TraceEvent",
]
