"""A small client of ``ferret.v1.Control`` (used by ``ferret control`` and the demo).

Every failed call raises :class:`ControlCallError` with the gRPC status code and one-line details; an
infeasible budget also carries ``min_feasible_bytes``, read from the reply's rich error details
(``google.rpc.ErrorInfo`` / ``PreconditionFailure``), else from the older trailing metadata.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from services.control.auth import channel_credentials, token_metadata
from services.control.errors import BUDGET_BELOW_MINIMUM, MIN_FEASIBLE_METADATA, ControlError
from services.proto_gen.ferret.v1 import control_pb2 as pb
from services.proto_gen.ferret.v1 import control_pb2_grpc

DEFAULT_TARGET = "127.0.0.1:50051"


class ControlCallError(ControlError):
    """A control call failed; ``code`` is the gRPC status, ``details`` the server's one-line reason."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str, min_feasible_bytes: int | None = None) -> None:
        self.method = method
        self.code = code
        self.details = details
        self.min_feasible_bytes = min_feasible_bytes
        super().__init__(f"{method}: {code.name}: {details}")


def min_feasible_from(exc: grpc.RpcError) -> int | None:
    """The minimum feasible budget an infeasible SetMemoryBudget reply carries (None: none)."""
    try:
        status = rpc_status.from_call(exc) if hasattr(exc, "trailing_metadata") else None
    except ValueError:  # details that contradict the call's code or message
        status = None
    for detail in status.details if status is not None else ():
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.reason == BUDGET_BELOW_MINIMUM and "min_feasible_bytes" in info.metadata:
            return int(info.metadata["min_feasible_bytes"])
    trailing = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == MIN_FEASIBLE_METADATA:
            return int(value)
    return None


def _error(method: str, exc: grpc.RpcError) -> ControlCallError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    details = (exc.details() if hasattr(exc, "details") else None) or str(code.name)
    minimum = min_feasible_from(exc) if code == grpc.StatusCode.FAILED_PRECONDITION else None
    return ControlCallError(method, code, details.splitlines()[0] if details else code.name, minimum)


class ControlClient:
    """One channel to a control plane. ``tls_ca`` (or ``tls=True`` for the system roots) turns TLS on;
    ``token`` is sent as ``authorization: Bearer <token>``; ``timeout_s`` bounds each unary call."""

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        token: str | None = None,
        tls_ca: Path | None = None,
        tls: bool = False,
        timeout_s: float = 30.0,
    ) -> None:
        if tls or tls_ca is not None:
            self._channel = grpc.secure_channel(target, channel_credentials(tls_ca))
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = control_pb2_grpc.ControlStub(self._channel)  # type: ignore[no-untyped-call]
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._metadata = token_metadata(token)
        self._timeout_s = timeout_s
        self.target = target

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Any) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self._timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise _error(method, exc) from None

    def set_memory_budget(self, budget_bytes: int | None) -> pb.PlanReply:
        """Re-plan for ``budget_bytes`` (None: no budget, unconstrained) and return the applied plan."""
        request = (
            pb.SetMemoryBudgetRequest(unconstrained=True)
            if budget_bytes is None
            else pb.SetMemoryBudgetRequest(budget_bytes=budget_bytes)
        )
        reply: pb.PlanReply = self._call("SetMemoryBudget", request)
        return reply

    def get_plan(self) -> pb.PlanReply:
        reply: pb.PlanReply = self._call("GetPlan", pb.GetPlanRequest())
        return reply

    def get_status(self) -> pb.StatusReply:
        reply: pb.StatusReply = self._call("GetStatus", pb.GetStatusRequest())
        return reply

    def watch_status(self, interval_s: float = 0.0, count: int | None = None) -> Generator[pb.StatusReply, None, None]:
        """Status updates every ``interval_s`` (0: the server's default), ``count`` of them or until the
        server ends the stream; leaving the loop early cancels the call."""
        call = self._stub.WatchStatus(pb.WatchStatusRequest(interval_s=interval_s), metadata=self._metadata)
        received = 0
        try:
            for reply in call:
                yield reply
                received += 1
                if count is not None and received >= count:
                    return
        except grpc.RpcError as exc:
            raise _error("WatchStatus", exc) from None
        finally:
            call.cancel()

    def save_snapshot(self, metadata: Mapping[str, str] | None = None) -> pb.SnapshotInfo:
        reply: pb.SnapshotInfo = self._call("SaveSnapshot", pb.SaveSnapshotRequest(metadata=dict(metadata or {})))
        return reply

    def restore_snapshot(self, version: int | None = None) -> pb.RestoreSnapshotReply:
        """Restore ``version`` (None: the newest valid snapshot)."""
        request = pb.RestoreSnapshotRequest() if version is None else pb.RestoreSnapshotRequest(version=version)
        reply: pb.RestoreSnapshotReply = self._call("RestoreSnapshot", request)
        return reply

    def list_snapshots(self, verify: bool = False) -> pb.ListSnapshotsReply:
        reply: pb.ListSnapshotsReply = self._call("ListSnapshots", pb.ListSnapshotsRequest(verify=verify))
        return reply

    def health(self, service: str = "") -> str:
        """``SERVING``, ``NOT_SERVING`` or ``SERVICE_UNKNOWN`` for a health service name."""
        try:
            reply = self._health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._timeout_s, metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise _error("Health.Check", exc) from None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))
