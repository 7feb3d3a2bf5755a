"""The import graph of ``ferret_core`` and ``services``: up-arrows, circles and imports inside functions.

``python scripts/import_graph.py`` prints the facts and exits 1 when the core breaks its ground plan;
``tests/unit/test_import_graph.py`` asserts the same facts. Standard library only, read from the source
(nothing is imported), so it runs before the project is installed.

The core's ground plan, bottom to top (a module may import its own layer or any layer below, never one
above; no circles anywhere, type-only imports included):

1. ``errors``
2. the shared vocabulary: ``plan``, ``profile``, ``staleness``, ``metrics``, ``forgetting``
3. pure leaves: ``schedule`` (actions, scheduler, step and timing data), ``compensation``, ``zoo``, ``data``
4. ``planning`` (profiler, partitions, cost and memory models, residency, search, planner)
5. ``engine`` (pipeline, clocks, policies, the facade)
6. ``ocl`` (algorithms as hooks over the engine's steps)
7. the package's own ``__init__``

An import inside a function (or under ``if TYPE_CHECKING:``) is allowed in the core only for an optional
third-party dependency (:data:`OPTIONAL_DEPENDENCIES`).
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CORE_LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("plan", "profile", "staleness", "metrics", "forgetting"),
    ("schedule", "compensation", "zoo", "data"),
    ("planning",),
    ("engine",),
    ("ocl",),
    ("",),  # ferret_core/__init__.py
)
OPTIONAL_DEPENDENCIES = frozenset({"sklearn", "scipy", "PIL", "torchvision"})


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both dotted module names of the package) at ``line``; ``nested``:
    the import is not at the module's top level (inside a function, a class or an ``if``)."""

    source: str
    target: str
    line: int
    nested: bool


@dataclass(frozen=True)
class LazyImport:
    """An import statement that is not at a module's top level."""

    module: str
    line: int
    imported: str


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` (a directory), by dotted name."""
    found: dict[str, Path] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if path.name != "__init__.py":
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, bool]]:
    top = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, id(node) not in top


def edges(mods: Mapping[str, Path]) -> tuple[list[Edge], list[LazyImport]]:
    """The package-internal import edges of ``mods`` and every import not at a module's top level."""
    found: list[Edge] = []
    lazy: list[LazyImport] = []
    for module, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, nested in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = _absolute(module, path, node)
                # `from pkg import sub` imports the submodule pkg.sub when there is one
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            if nested:
                lazy.append(LazyImport(module, node.lineno, targets[0]))
            for target in dict.fromkeys(targets):
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    found.append(Edge(module, target, node.lineno, nested))
    return found, lazy


def circles(found: Iterable[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for edge in found:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    result: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    result.append(sorted(component))
    return result


def core_layer(module: str) -> int:
    """The layer (index into :data:`CORE_LAYERS`) of a ``ferret_core`` module."""
    first = module.split(".")[1] if "." in module else ""
    for level, names in enumerate(CORE_LAYERS):
        if first in names:
            return level
    raise ValueError(
        f"ferret_core.{first} has no layer in scripts/import_graph.py CORE_LAYERS; add it where it belongs"
    )


def up_arrows(found: Iterable[Edge]) -> list[Edge]:
    """Core imports from a lower layer to a higher one."""
    return [edge for edge in found if core_layer(edge.target) > core_layer(edge.source)]


def disallowed_lazy(lazy: Iterable[LazyImport]) -> list[LazyImport]:
    """Imports not at a module's top level that are not of an optional third-party dependency."""
    return [imp for imp in lazy if imp.imported.split(".")[0] not in OPTIONAL_DEPENDENCIES]


def main() -> int:
    core_edges, core_lazy = edges(modules(ROOT / "ferret_core"))
    service_edges, service_lazy = edges(modules(ROOT / "services"))
    arrows = up_arrows(core_edges)
    core_circles = circles(core_edges)
    lazy = disallowed_lazy(core_lazy)
    cli_below = [
        e for e in service_edges if e.target.startswith("services.cli") and not e.source.startswith("services.cli")
    ]
    service_circles = circles(service_edges)
    core_problems = (
        [f"up-arrow {e.source} -> {e.target} (line {e.line})" for e in arrows]
        + [f"circle {' -> '.join(c)}" for c in core_circles]
        + [f"lazy {i.module}:{i.line} imports {i.imported}" for i in lazy]
    )
    service_problems = [f"circle {' -> '.join(c)}" for c in service_circles] + [
        f"{e.source} -> {e.target} (line {e.line}) imports the CLI from below it" for e in cli_below
    ]
    print(f"ferret_core: {len(core_edges)} import edges, {len(arrows)} up-arrows, {len(core_circles)} circles, "
          f"{len(lazy)} lazy imports (besides optional dependencies: {len(core_lazy) - len(lazy)})")
    print("".join(f"  {line}\n" for line in core_problems), end="")
    print(f"services: {len(service_edges)} import edges, {len(service_circles)} circles, "
          f"{len(cli_below)} imports of services.cli from below it, {len(service_lazy)} imports not at top level")
    print("".join(f"  {line}\n" for line in service_problems), end="")
    return 1 if core_problems or service_problems else 0


if __name__ == "__main__":
    sys.exit(main())
