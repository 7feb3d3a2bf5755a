"""A supervisor for one trainer process (``ferret run --supervise``): restart it when it exits with a
failure, with backoff, until it exits cleanly or fails too often.

Why: a trainer that stops on a failure it cannot handle in place (an executor process killed by the OOM
killer or kill -9, the record path's STOP decisions, docs/reliability.md) resumes from its last snapshot
and committed offsets when it starts again; something has to start it. Kubernetes restarts a failed pod
and compose has ``restart: on-failure``; the local stack and the demo use this.

What restarts: any exit other than 0 (a clean stop), 2 (a usage error) and 3 (an infeasible budget),
which a restart would only repeat. Backoff doubles from ``first_backoff_s`` up to ``max_backoff_s`` and
starts over after a child that ran ``reset_after_s``; after ``max_restarts`` restarts within
``window_s`` the supervisor gives up and exits with the child's code (no crash loop). SIGTERM and SIGINT
are forwarded to the child and end supervision (the child drains, snapshots and commits as always).
Every restart is logged with its count and the child's exit code, and the child gets its count in
``FERRET_SUPERVISOR_RESTARTS`` (it logs it at start). The child is sent SIGTERM if the supervisor itself
dies (Linux ``PR_SET_PDEATHSIG``), so no trainer outlives its supervisor: set in the child by the
:mod:`services.localstack.deathsig` trampoline before it ``exec``s the trainer, not by ``preexec_fn``,
which runs Python in a child forked from a process with threads (grpc, torch) and once crashed before the
trainer started (a red CI: the first child of ``test_usage_errors_and_infeasible_budgets_are_not_restarted``
died unlogged and was restarted).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType

from services.localstack.process import dying_with_this_process

log = logging.getLogger("ferret.supervisor")

NOT_RESTARTED = frozenset({0, 2, 3})  # a clean stop, a usage error, an infeasible budget
RESTARTS_ENV = "FERRET_SUPERVISOR_RESTARTS"


@dataclass(frozen=True)
class RestartPolicy:
    """When and how often a failed trainer is started again (module docstring)."""

    max_restarts: int = 5
    window_s: float = 600.0
    first_backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    reset_after_s: float = 60.0


def with_parent_death_signal(argv: Sequence[str]) -> list[str]:
    """``argv`` started through the deathsig trampoline: SIGTERM when the supervisor dies, even of SIGKILL,
    so a trainer never outlives it (it drains, snapshots and commits as on any SIGTERM)."""
    return list(dying_with_this_process(argv, "TERM"))


class Supervisor:
    """Runs ``argv`` as a child process and restarts it by :class:`RestartPolicy` (module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        policy: RestartPolicy | None = None,
        sleep: Callable[[float], bool] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.env = dict(os.environ if env is None else env)
        self.policy = policy or RestartPolicy()
        self.restarts = 0
        self.exit_codes: list[int] = []
        self._stopping = threading.Event()
        self._sleep = sleep or self._stopping.wait  # wakes early when stopped
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def run(self) -> int:
        """Run until the child exits cleanly, is stopped, or failed too often; returns its last exit code."""
        recent: list[float] = []
        backoff = self.policy.first_backoff_s
        while True:
            began = time.monotonic()
            code = self._run_once()
            self.exit_codes.append(code)
            ran = time.monotonic() - began
            if self._stopping.is_set() or code in NOT_RESTARTED:
                return code
            if ran >= self.policy.reset_after_s:
                backoff = self.policy.first_backoff_s
            now = time.monotonic()
            recent = [t for t in recent if now - t < self.policy.window_s]
            if len(recent) >= self.policy.max_restarts:
                log.error(
                    "the trainer exited with code %d, its %d-th failure within %.0f s: giving up",
                    code,
                    len(recent) + 1,
                    self.policy.window_s,
                )
                return code
            recent.append(now)
            self.restarts += 1
            log.warning(
                "the trainer exited with code %d after %.1f s; restart #%d in %.1f s", code, ran, self.restarts, backoff
            )
            if self._sleep(backoff):
                return code  # stopped while waiting
            backoff = min(backoff * 2, self.policy.max_backoff_s)

    def _run_once(self) -> int:
        env = {**self.env, RESTARTS_ENV: str(self.restarts)}
        with self._lock:
            if self._stopping.is_set():
                return 0
            self._child = subprocess.Popen(with_parent_death_signal(self.argv), env=env)
        return self._child.wait()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Forward ``signum`` to the child and restart nothing more."""
        with self._lock:
            self._stopping.set()
            child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    def forward_signals(self) -> None:
        """SIGTERM and SIGINT stop supervision and reach the child (call from the main thread)."""

        def forward(signum: int, _frame: FrameType | None) -> None:
            self.stop(signum)

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, forward)
