"""A call's deadline on the server side, checked right before a request changes anything.

A client whose deadline passed has already been answered DEADLINE_EXCEEDED; applying its budget,
writing its snapshot or restoring one afterwards would change the trainer behind the caller's back
(it may retry, or give up, believing nothing happened). The servicer takes the deadline from the call
and the work checks it where it has waited (for the re-plan worker, for the trainer loop's turn):

    deadline = CallDeadline.of(context)                 # None: the client set no deadline
    ...                                                 # wait for the worker / the loop
    if deadline is not None:
        deadline.check("the budget change")             # raises DeadlineExpired once it has passed
    apply()

A deadline that passes while the work runs does not interrupt it (a half-applied plan or half-written
snapshot is worse than a late one); the client learns the outcome from GetPlan / ListSnapshots.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

from services.control.errors import DeadlineExpired

# gRPC reports a call without a deadline as one ~292 years away; anything this far is "none".
NO_DEADLINE_S = 10.0**8


class _HasTimeRemaining(Protocol):
    def time_remaining(self) -> float | None: ...


@dataclass(frozen=True)
class CallDeadline:
    """When the caller stops waiting, in ``time.monotonic()`` seconds."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> CallDeadline:
        return cls(time.monotonic() + seconds)

    @classmethod
    def of(cls, context: _HasTimeRemaining) -> CallDeadline | None:
        """The deadline of a gRPC call (``context.time_remaining()``), or None when it has none."""
        remaining = context.time_remaining()
        if remaining is None or remaining > NO_DEADLINE_S:
            return None
        return cls.after(max(0.0, remaining))

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, what: str) -> None:
        """Raise :class:`DeadlineExpired` (nothing applied) when the deadline has passed."""
        late = -self.remaining()
        if late >= 0:
            raise DeadlineExpired(
                f"{what} was not applied: the caller's deadline passed {late:.3f} s before the trainer could "
                "run it; nothing changed (retry with a longer deadline, e.g. ferret control --timeout)"
            )
