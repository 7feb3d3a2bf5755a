"""``grpc.health.v1`` for the trainer: readiness, liveness and a degraded part as three service names.

============================  ==========================================================================
service name                  SERVING when
============================  ==========================================================================
``""`` (and ``ferret.v1.      readiness: the trainer says it is ready, no re-plan is in progress, no
Control``)                    guarded blocking write (a snapshot) has stalled past its deadline, the
                              replica has not gone without partitions past its bound
                              (``kafka.unassigned_readiness_s``) and the server is not shutting down.
                              Kubernetes' readiness probe checks this.
``ferret.liveness``           liveness: the trainer says it is alive and no guarded operation (a re-plan,
                              a snapshot) has overrun its deadline. A re-plan never fails it, so a
                              re-plan never gets the pod killed; the liveness probe checks this name.
``ferret.snapshots``          the snapshot store works; the trainer sets it NOT_SERVING while snapshots
                              fail or a write has hung longer than ``redis.stall_s`` (a degraded part:
                              readiness stays SERVING; writes run off the record path).
============================  ==========================================================================

During shutdown readiness and the snapshot part go NOT_SERVING and stay so; liveness stays SERVING
until the process exits (the grace period is not a reason to be killed).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

from grpc_health.v1 import health, health_pb2

READINESS = ""
CONTROL_SERVICE = "ferret.v1.Control"
LIVENESS = "ferret.liveness"
SNAPSHOTS = "ferret.snapshots"

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

log = logging.getLogger(__name__)


class ControlHealth:
    """Owns the health servicer and computes each name's status from a few flags.

    The trainer flips :meth:`set_ready`, :meth:`set_live` and :meth:`set_snapshots_ok`; the re-planner
    wraps its work in :meth:`replanning`; :meth:`deadline` guards any operation that could wedge.
    """

    def __init__(self, ready: bool = True) -> None:
        # Non-blocking Watch: a health watcher does not hold a thread of the server's pool.
        self.servicer = health.HealthServicer(experimental_non_blocking=True)
        self._lock = threading.Lock()
        self._ready = ready
        self._live = True
        self._snapshots_ok = True
        self._replans = 0
        self._overdue: set[str] = set()
        self._stalled: set[str] = set()
        self._unowned: threading.Timer | None = None  # running while this replica owns no partition
        self._unassigned = False  # ... and set once it has owned none for longer than the bound
        self._shutting_down = False
        self._publish()

    # -- flags the trainer sets ---------------------------------------------------------------------
    def set_ready(self, ready: bool) -> None:
        """The trainer's own readiness (e.g. False until it has a plan and its partitions)."""
        with self._lock:
            self._ready = ready
            self._publish()

    def set_owns_partitions(self, owns: bool, bound_s: float) -> None:
        """Whether this replica owns a partition now. Owning none for longer than ``bound_s`` makes readiness
        NOT_SERVING (a replica with nothing to read, or stuck in a rebalance, takes no stream) until it owns
        one again. Repeated calls without partitions keep the first deadline."""
        with self._lock:
            if owns:
                if self._unowned is not None:
                    self._unowned.cancel()
                    self._unowned = None
                self._unassigned = False
                self._publish()
                return
            if self._unowned is not None or self._unassigned:
                return
            timer = threading.Timer(bound_s, self._no_partitions, args=(bound_s,))
            timer.daemon = True
            self._unowned = timer
            timer.start()

    def _no_partitions(self, bound_s: float) -> None:
        with self._lock:
            if self._unowned is not threading.current_thread():  # cancelled or replaced meanwhile
                return
            self._unowned = None
            self._unassigned = True
            self._publish()
        log.warning("no partition assigned for %.1f s: readiness is NOT_SERVING until one is", bound_s)

    def set_live(self, live: bool) -> None:
        """The trainer's own liveness (e.g. False when its loop stopped making progress)."""
        with self._lock:
            self._live = live
            self._publish()

    def set_snapshots_ok(self, ok: bool) -> None:
        """The snapshot part: False while snapshots fail; readiness is not affected."""
        with self._lock:
            self._snapshots_ok = ok
            self._publish()

    # -- flags the control plane sets ---------------------------------------------------------------
    @contextlib.contextmanager
    def replanning(self) -> Iterator[None]:
        """Readiness is NOT_SERVING while at least one re-plan is inside this block."""
        with self._lock:
            self._replans += 1
            self._publish()
        try:
            yield
        finally:
            with self._lock:
                self._replans -= 1
                self._publish()

    @contextlib.contextmanager
    def deadline(self, what: str, seconds: float) -> Iterator[None]:
        """Liveness goes NOT_SERVING if the block is still running after ``seconds`` (the process is
        wedged) and comes back when the block ends."""
        timer = threading.Timer(seconds, self._overrun, args=(what, seconds))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with self._lock:
                self._overdue.discard(what)
                self._publish()

    @contextlib.contextmanager
    def readiness_deadline(self, what: str, seconds: float) -> Iterator[None]:
        """Readiness goes NOT_SERVING if the block is still running after ``seconds`` (e.g. a snapshot
        write stalled on a frozen Redis holds up the stream) and comes back when the block ends."""
        done = threading.Event()
        timer = threading.Timer(seconds, self._stall, args=(what, seconds, done))
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            with self._lock:
                done.set()
                self._stalled.discard(what)
                self._publish()

    def _stall(self, what: str, seconds: float, done: threading.Event) -> None:
        with self._lock:
            if done.is_set():
                return
            self._stalled.add(what)
            self._publish()
        log.warning("%s has blocked for more than %.1f s: readiness is NOT_SERVING until it ends", what, seconds)

    def enter_shutdown(self) -> None:
        """Readiness and the snapshot part go NOT_SERVING for good; liveness keeps its status."""
        with self._lock:
            self._shutting_down = True
            self._publish()

    # -- reading ------------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        with self._lock:
            return self._is_ready()

    @property
    def live(self) -> bool:
        with self._lock:
            return self._is_live()

    @property
    def snapshots_ok(self) -> bool:
        """What ``ferret.snapshots`` says (SERVING: True)."""
        with self._lock:
            return self._snapshots_ok and not self._shutting_down

    def _overrun(self, what: str, seconds: float) -> None:
        log.error("%s has run for more than %.0f s: liveness is NOT_SERVING until it ends", what, seconds)
        with self._lock:
            self._overdue.add(what)
            self._publish()

    def _is_ready(self) -> bool:
        idle = self._unassigned
        return self._ready and self._replans == 0 and not self._stalled and not idle and not self._shutting_down

    def _is_live(self) -> bool:
        return self._live and not self._overdue

    def _publish(self) -> None:
        """Push every name's status to the servicer (which notifies health watchers); under the lock."""
        ready = SERVING if self._is_ready() else NOT_SERVING
        self.servicer.set(READINESS, ready)
        self.servicer.set(CONTROL_SERVICE, ready)
        self.servicer.set(LIVENESS, SERVING if self._is_live() else NOT_SERVING)
        snapshots = self._snapshots_ok and not self._shutting_down
        self.servicer.set(SNAPSHOTS, SERVING if snapshots else NOT_SERVING)
