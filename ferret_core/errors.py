"""One root exception for the whole project.

Every error we raise derives from :class:`FerretError`; subclasses also inherit the matching built-in
exception so callers that catch ``ValueError`` and friends keep working. Messages say what was expected,
what was received, and how to fix it.
"""

from __future__ import annotations


class FerretError(Exception):
    """Root of every error raised by Ferret."""


class ConfigError(FerretError, ValueError):
    """A configuration value, argument or file is invalid."""


class ProfileError(FerretError, ValueError):
    """A layer profile is malformed or inconsistent with the model."""


class PlanningError(FerretError, RuntimeError):
    """The planner could not produce a plan for reasons other than the budget."""


class InfeasibleBudgetError(FerretError, ValueError):
    """No partition and configuration fits the memory budget.

    ``min_feasible_bytes`` is the smallest budget for which a plan exists (DESIGN §3.7).
    """

    def __init__(self, budget_bytes: int, min_feasible_bytes: int) -> None:
        self.budget_bytes = int(budget_bytes)
        self.min_feasible_bytes = int(min_feasible_bytes)
        super().__init__(
            f"memory budget {self.budget_bytes} bytes is below the minimum feasible "
            f"{self.min_feasible_bytes} bytes; raise the budget to at least {self.min_feasible_bytes}"
        )


class InfeasibleHostBudgetError(FerretError, ValueError):
    """No configuration fits every host's budget: over several hosts, the stage a host owns (or rank 0's
    record path and follower copies) needs more than ``host_budget_bytes`` on every plan.
    ``min_host_bytes`` is the smallest per-host budget for which a plan exists."""

    def __init__(self, host_budget_bytes: int, hosts: int, min_host_bytes: int) -> None:
        self.host_budget_bytes = int(host_budget_bytes)
        self.hosts = int(hosts)
        self.min_host_bytes = int(min_host_bytes)
        super().__init__(
            f"per-host memory budget {self.host_budget_bytes} bytes is below what every plan over {self.hosts} "
            f"host(s) needs on its fullest host, {self.min_host_bytes} bytes; raise the per-host budget to at least "
            f"{self.min_host_bytes}, or add hosts"
        )


class ScheduleError(FerretError, RuntimeError):
    """An engine invariant broke while running a schedule (a bug or a misused life cycle, not a user's
    value): an executor asked for what it does not hold, a version slot pool ran dry, a process died."""


class ExecutorLost(ScheduleError):
    """An executor process died (a signal, the OOM killer) or closed its pipe: no item's data and no
    training code raised, so nothing is to blame on a record. The master it may have been writing cannot be
    trusted; a caller restarts its executors from the last good state (the trainer: from its last snapshot
    and committed offsets)."""


class DataError(FerretError, FileNotFoundError):
    """A dataset is missing or malformed."""


class NotImplementedFeatureError(FerretError, NotImplementedError):
    """A documented feature that this version does not implement yet."""
