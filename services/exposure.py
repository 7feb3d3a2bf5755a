"""Binding a service port beyond loopback: only with authentication, or with an explicit ``insecure`` flag.

The gRPC control plane (``control.listen``) and the Prometheus endpoint (``metrics.addr``) refuse to bind
an address other clients can reach (``0.0.0.0``, ``[::]``, a host name, a routable IP) unless the port
authenticates its clients (a token, or TLS with client certificates) or the settings say
``insecure: true``, which logs a warning at every start. Loopback addresses (``127.0.0.0/8``, ``::1``,
``localhost``) need neither.
"""

from __future__ import annotations

import ipaddress
import logging

from ferret_core.errors import ConfigError

log = logging.getLogger(__name__)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP literal, ``[v6]`` or a name) binds only the loopback interface."""
    host = host.strip().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # "", "0.0.0.0"-like wildcards are IPs; any other name may resolve beyond loopback


def split_host(address: str) -> str:
    """The host part of ``HOST:PORT`` (``[v6]:port`` included)."""
    return address.rsplit(":", 1)[0] if ":" in address else address


def check_exposure(what: str, key: str, host: str, *, authenticated: bool, insecure: bool) -> None:
    """Raise ``ConfigError`` when ``host`` is beyond loopback with neither authentication nor
    ``insecure``; warn when ``insecure`` lets it through. ``key`` names the setting (for the message)."""
    if is_loopback(host) or authenticated:
        return
    shown = host or "every interface"
    if not insecure:
        raise ConfigError(
            f"{key}: {what} would listen on {shown} (beyond loopback) without authentication; set a token "
            f"(or TLS client certificates), bind 127.0.0.1, or set {key.rsplit('.', 1)[0]}.insecure: true to "
            "accept unauthenticated clients"
        )
    log.warning("%s listens on %s without authentication (%s.insecure is true)", what, shown, key.rsplit(".", 1)[0])
