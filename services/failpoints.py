"""Test-only fault injection at exact points: ``FERRET_FAILPOINT=name[:action][@N][,…]``.

A service calls :func:`failpoint` at a named point of a multi-step operation (between writing a
snapshot's chunks and committing its manifest, between planning and applying a plan). When the point is
enabled the call fails there, so a test reproduces "the process died mid-snapshot" by name rather than by
timing luck::

    FERRET_FAILPOINT=snapshot.mid-write:kill ferret run ...     # SIGKILL itself mid-write
    FERRET_FAILPOINT=control.mid-replan ferret run ...          # raise FailpointError there

Actions: ``raise`` (the default) raises :class:`FailpointError`; ``kill`` sends the process SIGKILL (no
clean-up runs, like ``kill -9``). ``@N`` fires at the point's N-th call only (default: every call), e.g.
``trainer.mid-record:kill@150`` kills the trainer after it trained its 150th item and before that item's
outcome is published. Names must be in :data:`KNOWN` (a typo fails at start, not silently).

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
        "trainer.mid-record",  # services/trainer/stream.py: an item predicted and trained, its outcome not published
        "trainer.mid-step",  # services/trainer/engine_learner.py: inside a training step (after a pipeline action)
        "trainer.mid-replan",  # services/trainer/engine_learner.py: old pipeline stopped, new one not started
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
        self.at: dict[str, int] = {}  # name -> the call that fires (absent: every call)
        self.calls: dict[str, int] = {}


_REGISTRY = _Registry()


def parse(spec: str) -> dict[str, Action]:
    """``"a,b:kill"`` → ``{"a": "raise", "b": "kill"}``; raises ``ConfigError`` for an unknown name/action."""
    return _parse(spec)[0]


def _parse(spec: str) -> tuple[dict[str, Action], dict[str, int]]:
    enabled: dict[str, Action] = {}
    at: dict[str, int] = {}
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        item, _, nth = item.partition("@")
        if nth and (not nth.isdigit() or int(nth) < 1):
            raise ConfigError(f"{ENV}: '@{nth}' in {item!r} must be a call number >= 1")
        name, _, action = item.partition(":")
        action = action or "raise"
        if name not in KNOWN:
            raise ConfigError(f"{ENV}: unknown failpoint {name!r}; expected one of {', '.join(sorted(KNOWN))}")
        if action not in ACTIONS:
            raise ConfigError(f"{ENV}: unknown action {action!r} for {name!r}; expected one of {', '.join(ACTIONS)}")
        enabled[name] = action  # type: ignore[assignment,unused-ignore]
        if nth:
            at[name] = int(nth)
    return enabled, at


def configure(env: Mapping[str, str] | None = None) -> dict[str, Action]:
    """Read ``FERRET_FAILPOINT`` from ``env`` (default ``os.environ``) and enable those failpoints."""
    enabled, at = _parse((os.environ if env is None else env).get(ENV, ""))
    with _REGISTRY._lock:
        _REGISTRY.enabled = enabled
        _REGISTRY.at = at
        _REGISTRY.calls = {}
    if enabled:
        log.warning("failpoints enabled (test-only): %s", ", ".join(f"{n}:{a}" for n, a in sorted(enabled.items())))
    return dict(enabled)


def is_enabled(name: str) -> bool:
    """Whether ``name`` is enabled (a caller may install a hook only then)."""
    enabled = _REGISTRY.enabled
    if enabled is None:
        enabled = configure()
    return name in enabled


def failpoint(name: str) -> None:
    """Fail here if ``name`` is enabled (see the module docstring); otherwise do nothing."""
    enabled = _REGISTRY.enabled
    if enabled is None:
        enabled = configure()
    if not enabled or name not in enabled:
        return
    nth = _REGISTRY.at.get(name)
    if nth is not None:
        with _REGISTRY._lock:
            _REGISTRY.calls[name] = call = _REGISTRY.calls.get(name, 0) + 1
        if call != nth:
            return
    if enabled[name] == "kill":
        log.error("failpoint %r: SIGKILL", name)
        os.kill(os.getpid(), signal.SIGKILL)
    raise FailpointError(name)
