"""``ferret.v1.Control``: the trainer's control plane (DESIGN §4 "gRPC").

Every handler is thin: validate, call the :class:`Replanner` or the :class:`TrainerPort`, convert with
:mod:`services.control.messages`. Errors become status codes in one place, :func:`status_for`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from ferret_core.errors import ConfigError, FerretError, InfeasibleBudgetError, InfeasibleHostBudgetError
from services.control.deadline import CallDeadline
from services.control.errors import (
    BUDGET_BELOW_MINIMUM,
    ERROR_DOMAIN,
    MIN_FEASIBLE_METADATA,
    BudgetNotPlanned,
    DeadlineExpired,
    InvalidRequest,
    ServiceUnavailable,
    Superseded,
    TooManyWatchers,
)
from services.control.messages import plan_reply, snapshot_message, status_reply
from services.control.replanner import Replanner
from services.control.trainer_port import TrainerPort, TrainerState
from services.proto_gen.ferret.v1 import control_pb2 as pb
from services.proto_gen.ferret.v1 import control_pb2_grpc

DEFAULT_WATCH_INTERVAL_S = 1.0
MIN_WATCH_INTERVAL_S = 0.01
MAX_WATCH_INTERVAL_S = 3600.0

log = logging.getLogger(__name__)

_Reply = TypeVar("_Reply")


def status_for(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and one-line details for an error raised while serving a call."""
    reason = (str(exc).splitlines() or [""])[0] or type(exc).__name__
    if isinstance(exc, (InfeasibleBudgetError, InfeasibleHostBudgetError, BudgetNotPlanned)):
        return grpc.StatusCode.FAILED_PRECONDITION, reason
    if isinstance(exc, (InvalidRequest, ConfigError)):
        return grpc.StatusCode.INVALID_ARGUMENT, reason
    if isinstance(exc, Superseded):
        return grpc.StatusCode.ABORTED, reason
    if isinstance(exc, FerretError) and isinstance(exc, LookupError):
        return grpc.StatusCode.NOT_FOUND, reason
    if isinstance(exc, ServiceUnavailable):
        return grpc.StatusCode.UNAVAILABLE, reason
    if isinstance(exc, TooManyWatchers):
        return grpc.StatusCode.RESOURCE_EXHAUSTED, reason
    if isinstance(exc, DeadlineExpired):
        return grpc.StatusCode.DEADLINE_EXCEEDED, reason
    if isinstance(exc, FerretError):
        return grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {reason}"
    return grpc.StatusCode.INTERNAL, f"unexpected {type(exc).__name__}: {reason}"


def requested_budget(request: pb.SetMemoryBudgetRequest) -> int | None:
    """The budget a SetMemoryBudget request asks for: its ``budget_bytes``, or None (unconstrained) when
    ``unconstrained`` is set and ``budget_bytes`` is not. Both set contradict each other
    (:class:`InvalidRequest`); ``budget_bytes`` alone is checked by the re-planner, as before the
    ``unconstrained`` field existed (so 0, what an empty request carries, stays INVALID_ARGUMENT)."""
    if not request.unconstrained:
        return int(request.budget_bytes)
    if request.budget_bytes != 0:
        raise InvalidRequest(
            f"set either budget_bytes or unconstrained, not both: got budget_bytes={request.budget_bytes} with "
            "unconstrained=true; send unconstrained=true alone to drop the budget"
        )
    return None


def infeasible_status(exc: InfeasibleBudgetError, details: str) -> grpc.Status:
    """FAILED_PRECONDITION with the minimum feasible budget as rich error details (``google.rpc``
    ``PreconditionFailure`` and ``ErrorInfo``, in ``grpc-status-details-bin``) and, for older clients,
    the ``ferret-min-feasible-bytes`` trailing metadata."""
    minimum = str(exc.min_feasible_bytes)
    violation = error_details_pb2.PreconditionFailure.Violation(
        type=BUDGET_BELOW_MINIMUM,
        subject="budget_bytes",
        description=f"the minimum feasible budget is {minimum} bytes",
    )
    info = error_details_pb2.ErrorInfo(
        reason=BUDGET_BELOW_MINIMUM, domain=ERROR_DOMAIN, metadata={"min_feasible_bytes": minimum}
    )
    detail_messages = [any_pb2.Any(), any_pb2.Any()]
    detail_messages[0].Pack(error_details_pb2.PreconditionFailure(violations=[violation]))
    detail_messages[1].Pack(info)
    rich = rpc_status.to_status(
        status_pb2.Status(code=code_pb2.FAILED_PRECONDITION, message=details, details=detail_messages)
    )
    return _Status(rich.code, rich.details, (*rich.trailing_metadata, (MIN_FEASIBLE_METADATA, minimum)))


class _Status(grpc.Status):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: tuple[tuple[str, Any], ...]) -> None:
        self.code, self.details, self.trailing_metadata = code, details, trailing_metadata


def _abort(context: grpc.ServicerContext, exc: BaseException) -> NoReturn:
    code, details = status_for(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.error("control call failed: %s", details, exc_info=exc)
    elif code == grpc.StatusCode.DEADLINE_EXCEEDED:
        log.warning("control call: %s", details)
    if isinstance(exc, InfeasibleBudgetError):
        context.abort_with_status(infeasible_status(exc, details))
    context.abort(code, details)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


def _unary(
    method: Callable[[ControlServicer, Any, grpc.ServicerContext], _Reply],
) -> Callable[[ControlServicer, Any, grpc.ServicerContext], _Reply]:
    """Maps every exception a unary handler raises to a status (see :func:`status_for`)."""

    @functools.wraps(method)
    def handler(self: ControlServicer, request: Any, context: grpc.ServicerContext) -> _Reply:
        try:
            return method(self, request, context)
        except Exception as exc:
            _abort(context, exc)

    return handler


class ControlServicer(control_pb2_grpc.ControlServicer):
    """Serves ``ferret.v1.Control`` over a trainer and a re-planner.

    ``max_watchers`` caps concurrent WatchStatus streams (each holds a server thread; the server's
    pool is sized for them plus the unary calls). :meth:`shutdown` ends every stream.
    """

    def __init__(self, trainer: TrainerPort, replanner: Replanner, *, max_watchers: int = 16) -> None:
        self._trainer = trainer
        self._replanner = replanner
        self._max_watchers = max_watchers
        self._lock = threading.Lock()
        self._watchers: set[threading.Event] = set()
        self._stopping = False
        self._started = time.monotonic()

    @property
    def watchers(self) -> int:
        with self._lock:
            return len(self._watchers)

    def shutdown(self) -> None:
        """End every WatchStatus stream (each sends a last STOPPING status) and refuse new ones."""
        with self._lock:
            self._stopping = True
            for done in self._watchers:
                done.set()

    # -- plans --------------------------------------------------------------------------------------
    @_unary
    def SetMemoryBudget(self, request: pb.SetMemoryBudgetRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        outcome = self._replanner.request(requested_budget(request), deadline=CallDeadline.of(context))
        return plan_reply(
            outcome.plan,
            outcome.version,
            applied_time_ms=outcome.applied_time_ms,
            planning_seconds=outcome.planning_seconds,
            stall_seconds=outcome.stall_seconds,
        )

    @_unary
    def GetPlan(self, request: pb.GetPlanRequest, context: grpc.ServicerContext) -> pb.PlanReply:
        return self._current_plan_reply()

    def _current_plan_reply(self) -> pb.PlanReply:
        plan, version = self._trainer.current_plan()
        last = self._replanner.last_outcome
        applied_ms = last.applied_time_ms if last is not None and last.version == version else 0
        return plan_reply(plan, version, applied_time_ms=applied_ms)

    # -- status -------------------------------------------------------------------------------------
    @_unary
    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.StatusReply:
        return self._status()

    def _status(self) -> pb.StatusReply:
        status = self._trainer.status()
        with self._lock:
            stopping = self._stopping
        if stopping:
            state = TrainerState.STOPPING
        elif self._replanner.busy:
            state = TrainerState.REPLANNING
        else:
            state = status.state
        return status_reply(
            status, state=state, time_ms=time.time_ns() // 1_000_000, uptime_s=time.monotonic() - self._started
        )

    def WatchStatus(self, request: pb.WatchStatusRequest, context: grpc.ServicerContext) -> Iterator[pb.StatusReply]:
        """A status now and then every ``interval_s`` until the client cancels (``context``'s callback
        sets the event) or the server stops (:meth:`shutdown` sets it)."""
        try:
            interval = _watch_interval(request.interval_s)
            done = self._add_watcher()
        except Exception as exc:
            _abort(context, exc)
        if not context.add_callback(done.set):
            done.set()
        try:
            while True:
                try:
                    reply = self._status()
                except Exception as exc:
                    _abort(context, exc)
                yield reply
                if done.wait(interval):
                    break
            with self._lock:
                stopping = self._stopping
            if stopping and context.is_active():
                yield self._status()  # a last one, in state STOPPING
        finally:
            with self._lock:
                self._watchers.discard(done)

    def _add_watcher(self) -> threading.Event:
        with self._lock:
            if self._stopping:
                raise ServiceUnavailable("the server is shutting down")
            if len(self._watchers) >= self._max_watchers:
                raise TooManyWatchers(
                    f"{len(self._watchers)} WatchStatus streams are open, the server's limit; "
                    "close one or poll GetStatus"
                )
            done = threading.Event()
            self._watchers.add(done)
            return done

    # -- snapshots ----------------------------------------------------------------------------------
    @_unary
    def SaveSnapshot(self, request: pb.SaveSnapshotRequest, context: grpc.ServicerContext) -> pb.SnapshotInfo:
        started = time.perf_counter()
        info = self._trainer.save_snapshot(dict(request.metadata), deadline=CallDeadline.of(context))
        if info.seconds == 0:
            info = dataclasses.replace(info, seconds=time.perf_counter() - started)
        return snapshot_message(info)

    @_unary
    def RestoreSnapshot(
        self, request: pb.RestoreSnapshotRequest, context: grpc.ServicerContext
    ) -> pb.RestoreSnapshotReply:
        version = request.version if request.HasField("version") else None
        if version is not None and version < 1:
            raise InvalidRequest(f"snapshot version must be >= 1 (or absent for the newest), got {version}")
        started = time.perf_counter()
        info = self._trainer.restore_snapshot(version, deadline=CallDeadline.of(context))
        # The restored plan replaces whatever a queued or running re-plan was about to apply.
        self._replanner.supersede()
        seconds = time.perf_counter() - started
        return pb.RestoreSnapshotReply(
            snapshot=snapshot_message(info), plan=self._current_plan_reply(), seconds=seconds
        )

    @_unary
    def ListSnapshots(self, request: pb.ListSnapshotsRequest, context: grpc.ServicerContext) -> pb.ListSnapshotsReply:
        infos = sorted(self._trainer.list_snapshots(request.verify), key=lambda s: s.version, reverse=True)
        latest = next((s.version for s in infos if s.valid), 0)
        return pb.ListSnapshotsReply(snapshots=[snapshot_message(s) for s in infos], latest_version=latest)


def _watch_interval(interval_s: float) -> float:
    if interval_s == 0:
        return DEFAULT_WATCH_INTERVAL_S
    if not (math.isfinite(interval_s) and MIN_WATCH_INTERVAL_S <= interval_s <= MAX_WATCH_INTERVAL_S):
        raise InvalidRequest(
            f"interval_s must be 0 (the default, {DEFAULT_WATCH_INTERVAL_S:g} s) or between "
            f"{MIN_WATCH_INTERVAL_S:g} and {MAX_WATCH_INTERVAL_S:g} seconds, got {interval_s}"
        )
    return interval_s
