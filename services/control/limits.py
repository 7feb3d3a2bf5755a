"""Bounded server-thread use: streams that hold a thread are capped in total and per peer.

A synchronous gRPC server runs every call on a pool thread; a stream (WatchStatus, a reflection session)
holds its thread until the client ends it. :class:`StreamLimiter` admits at most ``max_streams`` such
streams at once, and at most ``per_peer`` from one client address (the IP, not the port: a client
opening many connections is still one peer); beyond either it ends the call RESOURCE_EXHAUSTED at
once, before any work. The pool has ``max_streams + unary_workers`` threads, so unary calls always find
a thread. Streams that hold no thread (``grpc.health.v1`` Watch, served non-blocking) are not counted.

It runs after the token check (``auth.TokenAuthInterceptor`` is the first interceptor), so an
unauthenticated stream is refused before it can take a slot.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc


def peer_host(peer: str) -> str:
    """``ipv4:1.2.3.4:5678`` → ``1.2.3.4``; ``ipv6:[::1]:5678`` → ``::1``; anything else verbatim."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return peer


class StreamLimiter(grpc.ServerInterceptor):  # type: ignore[misc]
    """Caps thread-holding streams in total and per peer (module docstring)."""

    def __init__(self, max_streams: int, per_peer: int) -> None:
        if max_streams < 1 or per_peer < 1:
            raise ValueError(f"need max_streams >= 1 and per_peer >= 1, got {max_streams} and {per_peer}")
        self.max_streams = max_streams
        self.per_peer = per_peer
        self._lock = threading.Lock()
        self._by_peer: Counter[str] = Counter()

    @property
    def open_streams(self) -> int:
        with self._lock:
            return sum(self._by_peer.values())

    def intercept_service(
        self, continuation: Callable[[Any], grpc.RpcMethodHandler | None], details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(details)
        if handler is None or not handler.response_streaming:
            return handler
        behavior = handler.unary_stream or handler.stream_stream
        if getattr(behavior, "experimental_non_blocking", False):
            return handler  # holds no thread
        limited = self._limited(behavior, details.method)
        codecs = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(limited, **codecs)
        return grpc.stream_stream_rpc_method_handler(limited, **codecs)

    def _limited(self, behavior: Callable[..., Iterator[Any]], method: str) -> Callable[..., Iterator[Any]]:
        def limited(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            peer = peer_host(context.peer())
            refusal = self._acquire(peer)
            if refusal is not None:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{method}: {refusal}")
            try:
                yield from behavior(request, context)
            finally:
                self._release(peer)

        return limited

    def _acquire(self, peer: str) -> str | None:
        with self._lock:
            if self._by_peer[peer] >= self.per_peer:
                return f"{self._by_peer[peer]} streams from {peer} are open, the per-client limit; close one"
            if sum(self._by_peer.values()) >= self.max_streams:
                return f"{self.max_streams} streams are open, the server's limit; close one or poll instead"
            self._by_peer[peer] += 1
            return None

    def _release(self, peer: str) -> None:
        with self._lock:
            self._by_peer[peer] -= 1
            if self._by_peer[peer] <= 0:
                del self._by_peer[peer]
