"""The trainer's gRPC control plane: ``ferret.v1.Control`` + health + reflection (DESIGN §4).

A trainer implements :class:`TrainerPort` and calls ``create_server(planner, trainer, ...).start()``; a
call's :class:`CallDeadline` reaches the port's changing methods, which act only while it has not passed.
"""

from services.control.client import ControlCallError, ControlClient
from services.control.deadline import CallDeadline
from services.control.server import ControlServer, create_server, serve
from services.control.trainer_port import (
    AppliedPlan,
    PartitionOffset,
    SnapshotInfo,
    TrainerPort,
    TrainerState,
    TrainerStatus,
)

__all__ = [
    "AppliedPlan",
    "CallDeadline",
    "ControlCallError",
    "ControlClient",
    "ControlServer",
    "PartitionOffset",
    "SnapshotInfo",
    "TrainerPort",
    "TrainerState",
    "TrainerStatus",
    "create_server",
    "serve",
]
