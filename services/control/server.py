"""Building and running the control-plane server: :func:`create_server` / :func:`serve`.

``create_server`` wires a trainer (anything implementing :class:`TrainerPort`) and the Planner built at
start-up into a ``grpc.Server`` serving ``ferret.v1.Control``, ``grpc.health.v1`` and reflection, bound
but not started (the port is known, so tests use ``127.0.0.1:0``). ``serve`` starts it and blocks until
SIGTERM/SIGINT or a stop event, then stops gracefully.

Thread pool: ``max_watchers + unary_workers`` threads. A stream (WatchStatus, a reflection session)
holds a thread for its whole life, so at most ``max_watchers`` (default 16) streams run at once, at
most ``max_streams_per_peer`` (default 4) from one client address (:mod:`services.control.limits`;
beyond either: RESOURCE_EXHAUSTED at once), and ``unary_workers`` (default 8) threads are always left
for unary calls. A SetMemoryBudget call waits on the re-planner's own worker thread, so it holds one
unary thread and never computes on it. Health Watch streams are non-blocking and hold none.

Auth and exposure: with ``token``, every service on the port requires it, health and reflection
included (:mod:`services.control.auth`). ``health_address`` opens a second port serving only
``grpc.health.v1``, unauthenticated (statuses carry no secret) on its own two threads, for probes that
cannot send a token and so that no client of the control port can starve them. Binding the control
port beyond loopback needs a token, TLS with client certificates, or ``insecure=True`` (logged as a
warning) (:mod:`services.exposure`).

Graceful stop: readiness goes NOT_SERVING, WatchStatus streams end (each after a last STOPPING status),
queued re-plans fail UNAVAILABLE, in-flight calls get ``grace_s`` to finish, then the re-planner's
worker is joined. Nothing here forks; a trainer that needs helper processes starts them with ``spawn``
or ``subprocess`` (DESIGN §4), never ``fork`` after grpc is initialised.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import FrameType

import grpc
from grpc_health.v1 import health, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ferret_core.errors import ConfigError
from services.control.auth import ServerTls, TokenAuthInterceptor
from services.control.health import ControlHealth
from services.control.limits import StreamLimiter
from services.control.replanner import PlannerLike, Replanner, ReplanOutcome
from services.control.servicer import ControlServicer
from services.control.trainer_port import TrainerPort
from services.exposure import check_exposure, is_loopback, split_host
from services.proto_gen.ferret.v1 import control_pb2, control_pb2_grpc

DEFAULT_MAX_WATCHERS = 16
DEFAULT_UNARY_WORKERS = 8
DEFAULT_MAX_STREAMS_PER_PEER = 4
HEALTH_WORKERS = 2
QUEUED_CALLS = 64  # calls beyond the pool wait in a bounded queue; beyond it: RESOURCE_EXHAUSTED
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
    health_server: grpc.Server | None = None
    health_port: int | None = None
    limiter: StreamLimiter | None = None

    @property
    def target(self) -> str:
        """``host:port`` for a client on this machine."""
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "[::]") else self.host
        return f"{host}:{self.port}"

    def start(self) -> ControlServer:
        self.server.start()
        if self.health_server is not None:
            self.health_server.start()
        log.info("control plane listening on %s (health port %s)", self.target, self.health_port)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        """Graceful stop (module docstring); returns when the server has stopped."""
        self.health.enter_shutdown()
        self.servicer.shutdown()
        self.replanner.close(wait=False)
        self.server.stop(grace_s).wait()
        if self.health_server is not None:
            self.health_server.stop(0).wait()
        self.replanner.close(wait=True)


def create_server(
    planner: PlannerLike,
    trainer: TrainerPort,
    *,
    address: str = "127.0.0.1:0",
    token: str | None = None,
    tls: ServerTls | None = None,
    insecure: bool = False,
    health_address: str | None = None,
    max_watchers: int = DEFAULT_MAX_WATCHERS,
    unary_workers: int = DEFAULT_UNARY_WORKERS,
    max_streams_per_peer: int = DEFAULT_MAX_STREAMS_PER_PEER,
    ready: bool = True,
    stuck_after_s: float = 300.0,
    health_state: ControlHealth | None = None,
    on_replan: Callable[[ReplanOutcome], None] | None = None,
) -> ControlServer:
    """Wire the control plane and bind ``address`` (port 0: any free port); call ``.start()`` next.

    ``planner``: the ``ferret_core.planning.planner.Planner`` built once from the start-up profile.
    ``trainer``: the trainer's :class:`TrainerPort`. ``token``: require ``authorization: Bearer
    <token>`` on every call of this port. ``tls``: serve TLS from PEM files. ``insecure``: allow binding
    beyond loopback without a token or client certificates. ``health_address``: also serve
    ``grpc.health.v1`` alone, unauthenticated, there. ``ready``: initial readiness (the trainer flips it
    later through ``.health.set_ready``). ``health_state``: the trainer's own :class:`ControlHealth`,
    built before the trainer's parts so they can flip it (``ready`` is then ignored). ``on_replan``: called
    with every applied re-plan's :class:`ReplanOutcome` (the metrics' re-plan histograms). Raises
    ``ConfigError`` (one line) when a port cannot be bound.
    """
    authenticated = token is not None or (tls is not None and tls.client_ca_file is not None)
    check_exposure(
        "the control plane", "control.listen", split_host(address), authenticated=authenticated, insecure=insecure
    )
    if token is not None and tls is None and not _is_local(address):
        log.warning("the control token travels in clear text on %s: turn TLS on (control.tls_cert)", address)
    health_state = health_state if health_state is not None else ControlHealth(ready=ready)
    replanner = Replanner(planner, trainer, health_state, stuck_after_s=stuck_after_s, on_applied=on_replan)
    servicer = ControlServicer(trainer, replanner, max_watchers=max_watchers)
    threads = pool_size(max_watchers, unary_workers)
    limiter = StreamLimiter(max(1, max_watchers), max_streams_per_peer)
    interceptors: list[grpc.ServerInterceptor] = [TokenAuthInterceptor(token)] if token is not None else []
    server = grpc.server(
        ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ferret-grpc"),
        interceptors=[*interceptors, limiter],
        maximum_concurrent_rpcs=threads + QUEUED_CALLS,
        # Refuse to share a port with another process (gRPC sets SO_REUSEPORT by default on Linux).
        options=[("grpc.so_reuseport", 0)],
    )
    control_pb2_grpc.add_ControlServicer_to_server(servicer, server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health_state.servicer, server)
    reflection.enable_server_reflection((CONTROL_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    try:
        port = bind_port(server, address, tls, "control.listen")
        health_server, health_port = None, None
        if health_address is not None:
            health_server, health_port = health_only_server(
                health_state.servicer, health_address, "control.health_listen"
            )
    except ConfigError:
        replanner.close()
        raise
    host = split_host(address)
    return ControlServer(server, port, health_state, replanner, servicer, host, health_server, health_port, limiter)


def _is_local(address: str) -> bool:
    return is_loopback(split_host(address))


def bind_port(
    server: grpc.Server, address: str, tls: ServerTls | None, key: str, what: str = "the control plane"
) -> int:
    """Bind ``server`` to ``address`` (TLS where ``tls``); its port. A :class:`ConfigError` naming the setting
    ``key`` and the reason when it cannot (grpc raises, or returns port 0, depending on its version)."""
    try:
        port = server.add_secure_port(address, tls.credentials()) if tls else server.add_insecure_port(address)
    except RuntimeError as exc:
        port, reason = 0, str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    else:
        reason = "the address is in use or not local"
    if not port:
        raise ConfigError(f"{key}: cannot bind {what} to {address!r}: {reason}; pick another address")
    return int(port)


def health_only_server(
    servicer: health.HealthServicer, address: str, key: str, what: str = "the control plane"
) -> tuple[grpc.Server, int]:
    """An unstarted server answering ``grpc.health.v1`` alone at ``address``, and its port: plaintext even
    where the main port has TLS (the kubelet's gRPC probe speaks no TLS, and health statuses carry no
    secret). The control plane, ``ferret serve`` and a host that serves stages each have one."""
    server = grpc.server(
        ThreadPoolExecutor(max_workers=HEALTH_WORKERS, thread_name_prefix="ferret-health"),
        maximum_concurrent_rpcs=HEALTH_WORKERS + QUEUED_CALLS,
        options=[("grpc.so_reuseport", 0)],
    )
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    return server, bind_port(server, address, None, key, what)


def serve(
    planner: PlannerLike,
    trainer: TrainerPort,
    *,
    address: str = "127.0.0.1:50051",
    grace_s: float = 5.0,
    stop: threading.Event | None = None,
    token: str | None = None,
    tls: ServerTls | None = None,
    insecure: bool = False,
    health_address: str | None = None,
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
        insecure=insecure,
        health_address=health_address,
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
