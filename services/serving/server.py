"""The ``ferret serve`` process: a gRPC server with ``ferret.v1.Serving``, ``grpc.health.v1`` and server
reflection, the model follower, and the Prometheus endpoint.

Auth and exposure are the control plane's (:mod:`services.control.auth`, :mod:`services.exposure`):
``serving.token`` requires ``authorization: Bearer <token>`` on every service of the port (health and
reflection included), ``serving.tls_cert``/``tls_key`` serve TLS, and binding beyond loopback needs a
token or ``serving.insecure``. ``serving.health_listen`` serves ``grpc.health.v1`` alone, unauthenticated,
for probes. Health: ``""`` and ``ferret.v1.Serving`` are NOT_SERVING until the first model is in force
(a readiness probe keeps traffic away until Predict can answer), then SERVING until shutdown.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from services.control.auth import ServerTls, TokenAuthInterceptor
from services.control.server import bind_port, health_only_server
from services.exposure import check_exposure, is_loopback, split_host
from services.proto_gen.ferret.v1 import serving_pb2, serving_pb2_grpc
from services.serving.follower import ModelFollower
from services.serving.holder import ModelHolder, ServedModel
from services.serving.metrics import ServingMetrics
from services.serving.model_stream import ModelStreamReader
from services.serving.servicer import ServingServicer

SERVING_SERVICE_NAME: str = serving_pb2.DESCRIPTOR.services_by_name["Serving"].full_name
WORKERS = 8
QUEUED_CALLS = 64
PORT_NAME = "the serving port"  # in the error when an address cannot be bound

log = logging.getLogger("ferret.serve")


@dataclass
class ServingServer:
    """A bound serving server, its model holder and follower (``start`` / ``stop``)."""

    server: grpc.Server
    port: int
    host: str
    holder: ModelHolder
    metrics: ServingMetrics
    health: health.HealthServicer
    follower: ModelFollower | None = None
    health_server: grpc.Server | None = None
    health_port: int | None = None

    @property
    def target(self) -> str:
        host = "127.0.0.1" if self.host in ("", "0.0.0.0", "[::]") else self.host
        return f"{host}:{self.port}"

    def start(self) -> ServingServer:
        self.server.start()
        if self.health_server is not None:
            self.health_server.start()
        if self.follower is not None:
            self.follower.start()
        log.info("serving ferret.v1.Serving on %s (health port %s)", self.target, self.health_port)
        return self

    def stop(self, grace_s: float = 5.0) -> None:
        self.health.enter_graceful_shutdown()
        if self.follower is not None:
            self.follower.stop()
        self.server.stop(grace_s).wait()
        if self.health_server is not None:
            self.health_server.stop(0).wait()


def create_serving_server(
    reader: ModelStreamReader | None,
    *,
    address: str = "127.0.0.1:0",
    token: str | None = None,
    tls: ServerTls | None = None,
    insecure: bool = False,
    health_address: str | None = None,
    max_batch: int = 1024,
) -> ServingServer:
    """Wire and bind the serving server (not started). ``reader``: the model stream to follow (None: the
    caller sets ``.holder``'s model itself, as unit tests do)."""
    authenticated = token is not None or (tls is not None and tls.client_ca_file is not None)
    check_exposure("serving", "serving.listen", split_host(address), authenticated=authenticated, insecure=insecure)
    if token is not None and tls is None and not is_loopback(split_host(address)):
        log.warning("the serving token travels in clear text on %s: turn TLS on (serving.tls_cert)", address)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    for name in ("", SERVING_SERVICE_NAME):
        health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)  # until the first model

    def on_update(served: ServedModel) -> None:  # after `metrics` is bound below: no update comes before start()
        metrics.observe_update(served)
        for name in ("", SERVING_SERVICE_NAME):
            health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)

    holder = ModelHolder(reader.key if reader is not None else "the model stream", on_set=on_update)
    metrics = ServingMetrics(holder)
    interceptors = [TokenAuthInterceptor(token)] if token is not None else []
    server = grpc.server(
        ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="ferret-serve"),
        interceptors=interceptors,
        maximum_concurrent_rpcs=WORKERS + QUEUED_CALLS,
        options=[("grpc.so_reuseport", 0)],
    )
    serving_pb2_grpc.add_ServingServicer_to_server(ServingServicer(holder, metrics, max_batch), server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection((SERVING_SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
    port = bind_port(server, address, tls, "serving.listen", PORT_NAME)
    health_server, health_port = None, None
    if health_address is not None:
        health_server, health_port = health_only_server(
            health_servicer, health_address, "serving.health_listen", PORT_NAME
        )
    follower = ModelFollower(reader, holder) if reader is not None else None
    return ServingServer(
        server, port, split_host(address), holder, metrics, health_servicer, follower, health_server, health_port
    )
