"""Optional token auth (a server interceptor) and TLS credentials from PEM files.

Token: clients send the metadata ``authorization: Bearer <token>``; a call without it, or with another
token, ends UNAUTHENTICATED before reaching the servicer. This holds for every service on the control
port, ``grpc.health.v1`` and server reflection included (``grpcurl -H 'authorization: Bearer …'``): an
unauthenticated client can hold no server thread. Probes that cannot send a token (the kubelet's gRPC
probe) use the separate health port (``control.health_listen``), which serves ``grpc.health.v1`` alone.
The token travels in clear text on an insecure channel: turn TLS on whenever the port is reachable
beyond loopback.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from ferret_core.errors import ConfigError

AUTH_METADATA = "authorization"


def token_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The metadata a client sends with every call (empty without a token)."""
    return () if not token else ((AUTH_METADATA, f"Bearer {token}"),)


class TokenAuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Rejects every call whose ``authorization`` metadata is not ``Bearer <token>``."""

    def __init__(self, token: str) -> None:
        if not token or token != token.strip():
            raise ConfigError("the control token must be a non-empty string without surrounding spaces")
        self._expected = f"Bearer {token}".encode()

    def intercept_service(
        self, continuation: Callable[[Any], grpc.RpcMethodHandler | None], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        reason = self._rejection(details.invocation_metadata or ())
        handler = continuation(details)
        if reason is None or handler is None:
            return handler
        return _rejecting_handler(handler, reason)

    def _rejection(self, metadata: Sequence[tuple[str, str | bytes]]) -> str | None:
        values = [value for key, value in metadata if key == AUTH_METADATA]
        if not values:
            return "missing token: send the metadata 'authorization: Bearer <token>' (ferret control --token)"
        value = values[0].encode() if isinstance(values[0], str) else values[0]
        if len(values) != 1 or not hmac.compare_digest(value, self._expected):
            return "wrong token in the 'authorization' metadata"
        return None


def _rejecting_handler(handler: grpc.RpcMethodHandler, reason: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that ends the call UNAUTHENTICATED."""

    def deny(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    codecs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(deny, **codecs)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(deny, **codecs)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(deny, **codecs)
    return grpc.stream_stream_rpc_method_handler(deny, **codecs)


@dataclass(frozen=True)
class ServerTls:
    """The server's PEM certificate chain and private key; with ``client_ca_file``, clients must
    present a certificate signed by that CA (mutual TLS)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        key = _read_pem(self.key_file, "TLS private key")
        cert = _read_pem(self.cert_file, "TLS certificate")
        if self.client_ca_file is None:
            return grpc.ssl_server_credentials([(key, cert)])
        ca = _read_pem(self.client_ca_file, "client CA")
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=True)


def channel_credentials(ca_file: Path | None) -> grpc.ChannelCredentials:
    """Client TLS credentials trusting ``ca_file`` (None: the system's roots)."""
    ca = None if ca_file is None else _read_pem(ca_file, "TLS CA")
    return grpc.ssl_channel_credentials(root_certificates=ca)


def _read_pem(path: Path, what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the {what} file {str(path)!r}: {exc.strerror or exc}") from None
    if b"-----BEGIN" not in data:
        raise ConfigError(f"the {what} file {str(path)!r} is not PEM (no '-----BEGIN' line)")
    return data
