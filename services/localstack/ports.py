"""Loopback ports: pick a free one, and tell whether something accepts connections on one."""

from __future__ import annotations

import socket

LOOPBACK = "127.0.0.1"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it).

    Another process may take it before the caller binds it; callers that start a server on it retry
    with a new port when the server reports the address in use.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_accepts(host: str, port: int, timeout: float = 0.2) -> bool:
    """Whether a TCP connection to ``host:port`` succeeds within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def split_host_port(address: str, default_port: int) -> tuple[str, int]:
    """``"host:port"`` → ``("host", port)``; ``"host"`` → ``("host", default_port)``; ``[::1]:9092`` too."""
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            host, port_text = text, ""
    if not host:
        raise ValueError(f"invalid address {address!r}: expected HOST or HOST:PORT")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"invalid port in {address!r}: expected an integer in 1..65535")
    return host, int(port_text)
