"""The core's ground plan (``scripts/import_graph.py``): no import from a lower layer to a higher one, no
circles (type-only imports included), no import inside a function except of an optional dependency; and
the services have no circles either (the CLI on the roof is ``test_units.py``'s)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _graph() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "scripts" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("import_graph", module)
    spec.loader.exec_module(module)
    return module


graph = _graph()


@pytest.fixture(scope="module")
def core() -> tuple[list, list]:
    return graph.edges(graph.modules(ROOT / "ferret_core"))


def test_core_has_no_up_arrows(core: tuple[list, list]) -> None:
    edges, _ = core
    assert len(edges) > 100  # the walk saw the package
    assert [f"{e.source} -> {e.target}" for e in graph.up_arrows(edges)] == []


def test_core_has_no_circles(core: tuple[list, list]) -> None:
    assert graph.circles(core[0]) == []


def test_core_imports_at_top_level_except_optional_dependencies(core: tuple[list, list]) -> None:
    _, lazy = core
    assert [f"{i.module}:{i.line} {i.imported}" for i in graph.disallowed_lazy(lazy)] == []


def test_services_have_no_circles() -> None:
    edges, _ = graph.edges(graph.modules(ROOT / "services"))
    assert graph.circles(edges) == []


def test_every_core_package_has_a_layer(core: tuple[list, list]) -> None:
    for module in graph.modules(ROOT / "ferret_core"):
        graph.core_layer(module)  # raises for a package nobody placed


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "ferret_core" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "ferret_core"


def test_checker_finds_an_up_arrow_a_circle_and_a_lazy_import(tmp_path: Path) -> None:
    package = _write(
        tmp_path,
        {
            "__init__.py": "",
            "errors.py": "",
            "plan.py": "from ferret_core.planning import search\n",  # up-arrow: vocabulary -> planning
            "planning/__init__.py": "",
            "planning/search.py": "from ferret_core.planning.planner import x\n",
            "planning/planner.py": "from ferret_core.planning import search\nx = 1\n",  # circle
            "engine/__init__.py": "",
            "engine/clock.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ferret_core.engine import pipeline\n"
                "def f():\n    import scipy.io\n    from ferret_core.errors import E\n"
            ),
            "engine/pipeline.py": "",
        },
    )
    edges, lazy = graph.edges(graph.modules(package))
    arrows = [(e.source, e.target) for e in graph.up_arrows(edges)]
    assert arrows == [("ferret_core.plan", "ferret_core.planning.search")]
    assert graph.circles(edges) == [["ferret_core.planning.planner", "ferret_core.planning.search"]]
    assert [(i.module, i.imported) for i in graph.disallowed_lazy(lazy)] == [
        ("ferret_core.engine.clock", "ferret_core.engine.pipeline"),
        ("ferret_core.engine.clock", "ferret_core.errors"),
    ]


def test_the_script_reports_the_facts_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "import_graph.py")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 up-arrows, 0 circles, 0 lazy imports" in done.stdout
    assert "services:" in done.stdout and " 0 circles, 0 imports of services.cli from below it" in done.stdout
