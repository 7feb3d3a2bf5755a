"""The compose files as ``docker compose -f docker-compose.yml [-f docker-compose.hosts.yml] config`` reads
them, for the tests: ``${VAR}``, ``${VAR:-default}`` and ``$$`` interpolated with a given environment, and
each later file merged over the earlier ones as compose merges an override file (mappings key by key, the
``environment`` mapping by name; ``ports``, ``expose`` and ``volumes`` appended; every other sequence or
scalar replaced: ``command``, ``entrypoint``, a healthcheck's ``test``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BASE = "docker-compose.yml"
HOSTS = "docker-compose.hosts.yml"
APPENDED = frozenset({"ports", "expose", "volumes"})


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose's ${VAR}, ${VAR:-default} and $$, with ``env`` as the shell's environment."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, default = match.group(1), match.group(3) or ""
        return env.get(name) or default

    return re.sub(r"\$\$|\$\{(\w+)(:?-([^}]*))?\}", one, value)


def merge(base: Any, override: Any, key: str | None = None) -> Any:
    """``override`` over ``base`` as compose merges a later file over an earlier one."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    if key in APPENDED and isinstance(base, list) and isinstance(override, list):
        return base + [v for v in override if v not in base]
    return override


def compose(*files: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """The merged, interpolated configuration of ``files`` (default: the base file alone)."""
    merged: dict[str, Any] = {}
    for name in files or (BASE,):
        merged = merge(merged, yaml.safe_load((ROOT / name).read_text(encoding="utf-8")))
    return interpolate(merged, env or {})


def service_env(service: dict[str, Any]) -> dict[str, str]:
    return {k: "" if v is None else str(v) for k, v in service.get("environment", {}).items()}
