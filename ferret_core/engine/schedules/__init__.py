"""Pipeline schedules the paper compares with Ferret, as policies over the one engine (DESIGN §2): the
synchronous DAPPLE, zero bubble and Hanayo (1–3 waves), and the asynchronous PipeDream and PipeDream-2BW.

Modules: ``common`` (Ferret's plan as the starting point), ``flush_pipeline`` (the flush and the split
backward's actions), ``split_backward`` (B and W of one stage), ``synchronous`` / ``asynchronous`` (the
policies). Their scheduler (flush groups, B/W split, shared devices) is
:mod:`ferret_core.schedule.flush_scheduler`; their planned bytes are :mod:`ferret_core.planning.schedule_memory`.
Readings of the papers in our streaming setting: ``docs/schedules.md``.
"""

from ferret_core.engine.schedules.asynchronous import PipeDream, PipeDream2BW
from ferret_core.engine.schedules.synchronous import Dapple, Hanayo, ZeroBubble
from ferret_core.planning.schedule_memory import ScheduleShape, schedule_bytes, schedule_memory
from ferret_core.schedule.flush_scheduler import FlushRules, FlushScheduler

__all__ = [
    "Dapple",
    "FlushRules",
    "FlushScheduler",
    "Hanayo",
    "PipeDream",
    "PipeDream2BW",
    "ScheduleShape",
    "ZeroBubble",
    "schedule_bytes",
    "schedule_memory",
]
