"""ferret_core must stay pure: torch, numpy and the standard library only (STYLE lesson 1)."""

from __future__ import annotations

import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "ferret_core"
FORBIDDEN_MODULES = {"confluent_kafka", "grpc", "redis", "yaml", "valkey", "services", "prometheus_client"}
FORBIDDEN_CALLS = {("os", "environ"), ("os", "getenv")}


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            names = []
        for name in names:
            if name.split(".")[0] in FORBIDDEN_MODULES:
                found.append(f"{path.name}:{node.lineno} imports {name}")
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in FORBIDDEN_CALLS
        ):
            found.append(f"{path.name}:{node.lineno} reads the environment ({node.value.id}.{node.attr})")
    return found


def test_core_imports_nothing_forbidden() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert files, "ferret_core has no modules"
    violations = [v for f in files for v in _violations(f)]
    assert violations == []


def test_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nfrom confluent_kafka import Producer\nx = os.environ['A']\n")
    assert len(_violations(bad)) == 2
