"""Test-only fault injection at exact points: ``FERRET_FAILPOINT=name[:action][,name[:action]…]``.

A service calls :func:`failpoint` at a named point of a multi-step operation (between writing a
snapshot's chunks and committing its manifest, between planning and applying a plan). When the point is
enabled the call fails there, so a test reproduces "the process died mid-snapshot" by name rather than by
timing luck::

    FERRET_FAILPOINT=snapshot.mid-write:kill ferret run ...     # SIGKILL itself mid-write
    FERRET_FAILPOINT=control.mid-replan ferret run ...          # raise FailpointError there

Actions: ``raise`` (the default) raises :class:`FailpointError`; ``kill`` sends the process SIGKILL (no
clean-up runs, like ``kill -9``). Names must be in :data:`KNOWN` (a typo fails at start, not silently).

The environment is read once, by :func:`configure` (services call it at start; the first
:func:`failpoint` call does it otherwise). Disabled, a call costs one set lookup on an empty frozenset.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Mapping
from typing import Literal

from ferret_core.errors import ConfigError, FerretError

ENV = "FERRET_FAILPOINT"
Action = Literal["raise", "kill"]
ACTIONS: tuple[Action, ...] = ("raise", "kill")

# Every failpoint a service declares; the trainer's loop adds its own names here when it gets them.
KNOWN: frozenset[str] = frozenset(
    {
        "snapshot.mid-write",  # services/snapshots/store.py: chunks written, manifest not yet committed
        "control.mid-replan",  # services/control/replanner.py: planned, not yet applied
    }
)

log = logging.getLogger(__name__)


class FailpointError(FerretError, RuntimeError):
    """Raised at an enabled failpoint whose action is ``raise``."""

    def __init__(self, name: str) -> None:
        super().__init__(f"failpoint {name!r} triggered ({ENV})")
        self.name = name


class _Registry:
    """The enabled failpoints (read once) behind a lock only for (re)configuration."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.enabled: dict[str, Action] | None = None


_REGISTRY = _Registry()


def parse(spec: str) -> dict[str, Action]:
    """``"a,b:kill"`` → ``{"a": "raise", "b": "kill"}``; raises ``ConfigError`` for an unknown name/action."""
    enabled: dict[str, Action] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, action = item.partition(":")
        action = action or "raise"
        if name not in KNOWN:
            raise ConfigError(f"{ENV}: unknown failpoint {name!r}; expected one of {', '.join(sorted(KNOWN))}")
        if action not in ACTIONS:
            raise ConfigError(f"{ENV}: unknown action {action!r} for {name!r}; expected one of {', '.join(ACTIONS)}")
        enabled[name] = action  # type: ignore[assignment,unused-ignore]
    return enabled


def configure(env: Mapping[str, str] | None = None) -> dict[str, Action]:
    """Read ``FERRET_FAILPOINT`` from ``env`` (default ``os.environ``) and enable those failpoints."""
    enabled = parse((os.environ if env is None else env).get(ENV, ""))
    with _REGISTRY._lock:
        _REGISTRY.enabled = enabled
    if enabled:
        log.warning("failpoints enabled (test-only): %s", ", ".join(f"{n}:{a}" for n, a in sorted(enabled.items())))
    return dict(enabled)


def failpoint(name: str) -> None:
    """Fail here if ``name`` is enabled (see the module docstring); otherwise do nothing."""
    enabled = _REGISTRY.enabled
    if enabled is None:
        enabled = configure()
    if not enabled or name not in enabled:
        return
    if enabled[name] == "kill":
        log.error("failpoint %r: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailpointError(name)
