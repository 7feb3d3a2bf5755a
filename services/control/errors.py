"""Errors of the control plane; :mod:`services.control.servicer` maps each to one gRPC status code.

=====================================  ===================  ==================================
error                                  gRPC status          raised by
=====================================  ===================  ==================================
:class:`InvalidRequest` (ConfigError)  INVALID_ARGUMENT     request validation
``InfeasibleBudgetError`` (core)       FAILED_PRECONDITION  the planner (message: the minimum)
:class:`BudgetNotPlanned`              FAILED_PRECONDITION  a trainer whose method has a fixed plan
``InfeasibleHostBudgetError`` (core)   FAILED_PRECONDITION  the planner (per-host budget)
:class:`Superseded`                    ABORTED              the re-planner (a newer request won)
:class:`SnapshotNotFound`              NOT_FOUND            the trainer (any ``FerretError`` that
                                                            is also a ``LookupError`` counts)
:class:`ServiceUnavailable`            UNAVAILABLE          shutting down
:class:`DeadlineExpired`               DEADLINE_EXCEEDED    the re-planner, the trainer loop (the
                                                            caller's deadline passed before the
                                                            request could act: not applied)
:class:`TooManyWatchers`               RESOURCE_EXHAUSTED   WatchStatus beyond the watcher cap
``ScheduleError`` (core)               INTERNAL             the engine (a broken invariant or a
                                                            misused life cycle: not the caller's
                                                            value, so never INVALID_ARGUMENT)
any other ``FerretError``              INTERNAL             the trainer, the planner
=====================================  ===================  ==================================

The snapshot store's ``services.snapshots.SnapshotNotFoundError`` is also a ``FerretError`` and a
``LookupError``, so a trainer may let it through unchanged and the client still gets NOT_FOUND.
"""

from __future__ import annotations

from ferret_core.errors import ConfigError, FerretError

# A FAILED_PRECONDITION reply to SetMemoryBudget carries the minimum feasible bytes as gRPC rich error
# details (google.rpc.PreconditionFailure with a violation of this type on subject "budget_bytes", and
# google.rpc.ErrorInfo with this reason, ERROR_DOMAIN and metadata {"min_feasible_bytes": "<bytes>"}),
# and, for clients without grpcio-status, in this trailing metadata key. No client parses the message.
MIN_FEASIBLE_METADATA = "ferret-min-feasible-bytes"
BUDGET_BELOW_MINIMUM = "BUDGET_BELOW_MINIMUM"
ERROR_DOMAIN = "ferret.v1"


class ControlError(FerretError):
    """Root of the control plane's own errors."""


class InvalidRequest(ControlError, ConfigError):
    """A request field is malformed or out of range (gRPC INVALID_ARGUMENT)."""


class Superseded(ControlError, RuntimeError):
    """A re-plan lost the race with a newer request and was not applied (gRPC ABORTED)."""

    def __init__(self, budget_bytes: int | None, generation: int, latest_generation: int) -> None:
        self.budget_bytes = budget_bytes  # None: the re-plan was for no budget (unconstrained)
        self.generation = generation
        self.latest_generation = latest_generation
        wanted = "no budget (unconstrained)" if budget_bytes is None else f"{budget_bytes} bytes"
        super().__init__(
            f"re-plan #{generation} for {wanted} was superseded by the newer request "
            f"#{latest_generation} and not applied; the newest budget wins"
        )


class SnapshotNotFound(ControlError, LookupError):
    """The requested snapshot (or, with no version, any valid snapshot) does not exist (gRPC NOT_FOUND).

    ``SnapshotNotFound(7)`` / ``SnapshotNotFound(None)`` word the message; a string is used verbatim.
    """

    def __init__(self, what: int | str | None = None) -> None:
        self.version = what if isinstance(what, int) else None
        if isinstance(what, str):
            message = what
        elif what is None:
            message = "no valid snapshot exists; write one with `ferret control snapshot`"
        else:
            message = f"snapshot version {what} does not exist; list the versions with `ferret control snapshots`"
        super().__init__(message)


class BudgetNotPlanned(ControlError, RuntimeError):
    """The trainer's method does not plan for a memory budget (e.g. ``oracle``, ``1-skip``); the plan in
    force is unchanged (gRPC FAILED_PRECONDITION)."""


class ServiceUnavailable(ControlError, RuntimeError):
    """The service is shutting down or cannot serve the call now (gRPC UNAVAILABLE)."""


class DeadlineExpired(ControlError, TimeoutError):
    """The caller's deadline passed before the request could act, so it was not applied: no budget
    changed, no snapshot written or restored (gRPC DEADLINE_EXCEEDED; :mod:`services.control.deadline`)."""


class TooManyWatchers(ControlError, RuntimeError):
    """More WatchStatus streams than the server reserves threads for (gRPC RESOURCE_EXHAUSTED)."""
