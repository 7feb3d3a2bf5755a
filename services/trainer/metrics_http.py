"""The Prometheus endpoint: bound with one-line errors, optionally behind a bearer token.

    server = serve_metrics(registry, settings.metrics)      # MetricsEndpoint; .port, .stop()

- ``metrics.addr`` beyond loopback needs ``metrics.token`` or ``metrics.insecure: true``
  (:mod:`services.exposure`; the latter logs a warning).
- With a token, a scrape without ``Authorization: Bearer <token>`` gets 401 (Prometheus:
  ``authorization: {credentials: <token>}`` in the scrape config). Compared in constant time.
- A bad address or a port in use raises ``ConfigError`` naming the setting, the address and the reason,
  in one line (not a traceback).
"""

from __future__ import annotations

import hmac
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer, _SilentHandler

from ferret_core.errors import ConfigError
from services.config import MetricsSettings
from services.exposure import check_exposure

StartResponse = Callable[..., Any]


def bearer_guard(app: Callable[..., Iterable[bytes]], token: str) -> Callable[..., Iterable[bytes]]:
    """A WSGI app that answers 401 unless the request carries ``Authorization: Bearer <token>``."""
    expected = f"Bearer {token}".encode()

    def guarded(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        given = str(environ.get("HTTP_AUTHORIZATION", "")).encode()
        if not hmac.compare_digest(given, expected):
            start_response("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", "Bearer")])
            return [b"missing or wrong bearer token\n"]
        return app(environ, start_response)

    return guarded


@dataclass
class MetricsEndpoint:
    server: WSGIServer
    thread: threading.Thread
    port: int

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(registry: CollectorRegistry, settings: MetricsSettings) -> MetricsEndpoint:
    """Serve ``registry`` at ``settings.addr:settings.port`` (port 0: a free one) on a daemon thread."""
    if settings.port is None:
        raise ConfigError("metrics.port is null: the metrics endpoint is off")
    check_exposure(
        "the metrics endpoint", "metrics.addr", settings.addr, authenticated=settings.token is not None,
        insecure=settings.insecure,
    )  # fmt: skip
    address = f"{settings.addr}:{settings.port}"
    try:
        infos = socket.getaddrinfo(settings.addr, settings.port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ConfigError(f"metrics.addr: cannot bind the metrics endpoint to {address}: {exc}") from None

    class Server(ThreadingWSGIServer):
        address_family = infos[0][0]

    app = make_wsgi_app(registry)
    if settings.token is not None:
        app = bearer_guard(app, settings.token)
    try:
        server = make_server(settings.addr, settings.port, app, Server, handler_class=_SilentHandler)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            f"metrics.port: cannot bind the metrics endpoint to {address}: {reason}; pick another metrics.port "
            "(0 picks a free one) or stop what uses it"
        ) from None
    thread = threading.Thread(target=server.serve_forever, name="ferret-metrics", daemon=True)
    thread.start()
    return MetricsEndpoint(server, thread, int(server.server_port))
