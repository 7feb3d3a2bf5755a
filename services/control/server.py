"""Building and running the control-plane server: :func:`create_server` / :func:`serve`.

``create_server`` wires a trainer (anything implementing :class:`TrainerPort`) and the Planner built at
start-up into a ``grpc.Server`` serving ``ferret.v1.Control``, ``grpc.health.v1`` and reflection, bound
but not started (the port is known, so tests use ``127.0.0.1:0``). ``serve`` starts it and blocks until
SIGTERM/SIGINT or a stop event, then stops gracefully.

Thread pool: ``max_watchers + unary_workers`` threads. A WatchStatus stream holds a thread for its
whole life, so ``max_watchers`` (default 16) are reserved for them (the servicer refuses more with
RESOURCE_EXHAUSTED); ``unary_workers`` (default 8) serve unary calls and reflection streams. A
SetMemoryBudget call waits on the re-planner's own worker thread, so it holds one unary thread and
never computes on it. Health Watch streams are non-blocking and hold none.

Graceful stop: readiness goes NOT_SERVING, WatchStatus streams end (each after a last STOPPING status),
queued re-plans fail UNAVAILABLE, in-flight calls get ``grace_s`` to finish, then the re-planner's
worker is joined. Nothing here forks; a trainer that needs helper processes starts them with ``spawn``
or ``subprocess`` (DESIGN §4), never ``fork`` after grpc is initialised.
"""

from __future__ import annotations

import logging
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ferret_core.errors import ConfigError
from services.control.auth import ServerTls, TokenAuthInterceptor
from services.control.health import ControlHealth
from services.control.replanner import PlannerLike, Replanner
from services.control.servicer import ControlServicer
from services.control.trainer_port import TrainerPort
from services.proto_gen.ferret.v1 import control_pb2, control_pb2_grpc

DEFAULT_MAX_WATCHERS = 16
DEFAULT_UNARY_WORKERS = 8
CONTROL_SERVICE_NAME: str = control_pb2.DESCRIPTOR.services_by_name["Control"].full_name

log = logging.getLogger(__name__)


def pool_size(max_watchers: int, unary_workers: int) -> int:
    """Server threads: one per allowed WatchStatus stream plus the unary workers (module docstring)."""
    if max_watchers < 0 or unary_workers < 1:
        raise ConfigError(f"need max_watchers >= 0 and unary_workers >= 1, got {max_watchers} and {unary_workers}")
    return max_watchers + unary_workers


@dataclass
class ControlServer:
    """A bound control-plane server and the parts a trainer talks to (``health`` to flip its flags)."""

    server: grpc.Server
    port: int
    health: ControlHealth
    replanner: Replanner
    servicer: ControlServicer
    host: str

    @property
    def target(self) -> str:
        """``host:port`` for a client on this machine."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "[::]") else self.host
        return f"{host}:{self.port}"

    def start(self) -> ControlServer:
        self.server.start()
        log.info("control plane listening on %s", self.target)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop (module docstring); returns when the server has stopped."""
        self.health.enter_shutdown()
        self.servicer.shutdown()
        self.replanner.close(wait=False)
        self.server.stop(grace_s).wait()
        self.replanner.close(wait=True)


def create_server(
    planner: PlannerLike,
    trainer: TrainerPort,
    *,
    address: str = "127.0.0.1:0",
    token: str | None = None,
    tls: ServerTls | None = None,
    max_watchers: int = DEFAULT_MAX_WATCHERS,
    unary_workers: int = DEFAULT_UNARY_WORKERS,
    ready: bool = True,
    stuck_after_s: float = 300.0,
) -> ControlServer:
    """Wire the control plane and bind ``address`` (port 0: any free port); call ``.start()`` next.

    ``planner``: the ``ferret_core.planner.Planner`` built once from the start-up profile.
    ``trainer``: the trainer's :class:`TrainerPort`. ``token``: require ``authorization: Bearer
    <token>`` (health and reflection exempt). ``tls``: serve TLS from PEM files. ``ready``: initial
    readiness (the trainer flips it later through ``.health.set_ready``).
    """
    health_state = ControlHealth(ready=ready)
    replanner = Replanner(planner, trainer, health_state, stuck_after_s=stuck_after_s)
    servicer = ControlServicer(trainer, replanner, max_watchers=max_watchers)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=pool_size(max_watchers, unary_workers), thread_name_prefix="ferret-grpc"),
        interceptors=[TokenAuthInterceptor(token)] if token is not None else [],
        # Refuse to share a port with another process (gRPC sets SO_REUSEPORT by default on Linux).
        options=[("grpc.so_reuseport", 0)],
    )
    control_pb2_grpc.add_ControlServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health_state.servicer, server)
    reflection.enable_server_reflection((CONTROL_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    host = address.rsplit(":", 1)[0]
    try:
        port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:
        port, reason = 0, str(exc)
    else:
        reason = "the address is in use or not local"
    if not port:
        replanner.close()
        raise ConfigError(f"cannot bind the control plane to {address!r}: {reason}; pick another --control-address")
    return ControlServer(server, port, health_state, replanner, servicer, host)


def serve(
    planner: PlannerLike,
    trainer: TrainerPort,
    *,
    address: str = "127.0.0.1:50051",
    grace_s: float = 5.0,
    stop: threading.Event | None = None,
    token: str | None = None,
    tls: ServerTls | None = None,
    max_watchers: int = DEFAULT_MAX_WATCHERS,
    unary_workers: int = DEFAULT_UNARY_WORKERS,
) -> None:
    """Run the control plane until ``stop`` is set or, on the main thread, SIGTERM/SIGINT arrives."""
    stop = stop or threading.Event()
    control = create_server(
        planner,
        trainer,
        address=address,
        token=token,
        tls=tls,
        max_watchers=max_watchers,
        unary_workers=unary_workers,
    ).start()
    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():

        def on_signal(signum: int, frame: FrameType | None) -> None:
            log.info("signal %d: stopping the control plane (grace %.1f s)", signum, grace_s)
            stop.set()

        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, on_signal)
    try:
        stop.wait()
    finally:
        control.stop(grace_s)
        for restored, handler in previous.items():
            signal.signal(restored, handler)  # type: ignore[arg-type]
