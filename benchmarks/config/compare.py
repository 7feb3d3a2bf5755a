"""Today's ``services/config`` vs a pydantic-settings prototype: lines of code and error messages side by side.

.venv/bin/pip install pydantic-settings==2.16.3    # not a project dependency
.venv/bin/python -m benchmarks.config.compare > benchmarks/config/results/pydantic_settings.md
"""

from __future__ import annotations

import ast
from pathlib import Path

from pydantic import ValidationError

from benchmarks.config import pydantic_prototype as proto
from ferret_core.errors import ConfigError
from services.config import load_settings

ROOT = Path(__file__).resolve().parents[2]

CONFIG = ROOT / "services" / "config"
# Pieces of today's code the prototype replaces by pydantic (coercion and type checks) ...
REPLACED_IN_VALUES = {"coerce", "has_type", "describe", "is_optional", "_float"}
# ... and pieces it would still need, carried over unchanged (methods, cross-checks, Kafka checks, logs).
KEPT_IN_SECTIONS = {
    "MANAGED_KAFKA_PROPERTIES",
    "_check_properties",
    "librdkafka_rejects",
    "_check_key",
    "_check_rate",
    "_check_optional_listen",
    "_cross_check",
    "topics",
    "resolved_instance_id",
    "client_config",
    "producer_config",
    "consumer_config",
    "redacted",
}
KEPT_IN_LOADER = {"_read_yaml", "_check_known", "_did_you_mean", "_unknown_variable", "OTHER_VARIABLES"}


def span(node: ast.AST) -> int:
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])  # type: ignore[attr-defined]
    return int(node.end_lineno) - first + 1  # type: ignore[attr-defined]


def named_lines(path: Path, names: set[str]) -> int:
    total = 0
    for node in ast.walk(ast.parse(path.read_text())):
        name = getattr(node, "name", None)
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        if name in names and isinstance(node, ast.FunctionDef | ast.Assign | ast.ClassDef):
            total += span(node)
    return total


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


BAD = {
    "redis URL, non-numeric port": "redis:\n  url: redis://127.0.0.1:abc/0\n",
    "redis URL, wrong scheme + password": "redis:\n  url: http://admin:hunter2@127.0.0.1:6379/0\n",
    "metrics address": "metrics:\n  addr: not an address!\n",
    "kafka.properties unknown name": "kafka:\n  properties:\n    foo.bar: '1'\n",
    "kafka.properties bad value": "kafka:\n  properties:\n    linger.ms: abc\n",
    "kafka.properties out of range": "kafka:\n  properties:\n    linger.ms: '-5'\n",
    "integer expected": "kafka:\n  sample_partitions: many\n",
    "below the minimum": "trainer:\n  lr: -1\n",
    "typo in a key": "kafka:\n  bootstrap_server: a:1\n",
    "budget with a bad suffix": "trainer:\n  budget_bytes: 5 lots\n",
    "secret of the wrong type": "control:\n  token: [a, b]\n",
}


ENV_TYPO = {"FERRET_KAFKA_BOOTSTRAP_SERVER": "a:1"}  # a typo in an environment variable's name


def today(path: Path, env: dict[str, str] | None = None) -> str:
    try:
        load_settings(path, env=env or {})
    except ConfigError as exc:
        return str(exc).replace(str(path), "FILE")
    return "(accepted)"


def pydantic(path: Path, env: dict[str, str] | None = None) -> tuple[str, int]:
    try:
        proto.load(path, env or {})
    except ValidationError as exc:
        return proto.one_line(exc), len(str(exc).splitlines())
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}", len(str(exc).splitlines())
    return "(accepted)", 0


def main() -> None:
    tmp = Path("/tmp/ferret-config-compare.yaml")
    current = sum(lines(CONFIG / n) for n in ("loader.py", "sections.py", "values.py"))
    values = lines(CONFIG / "values.py") - named_lines(CONFIG / "values.py", REPLACED_IN_VALUES)
    kept = named_lines(CONFIG / "sections.py", KEPT_IN_SECTIONS) + named_lines(CONFIG / "loader.py", KEPT_IN_LOADER)
    prototype = lines(Path(__file__).parent / "pydantic_prototype.py")
    after = prototype + values + kept
    print("# services/config: today vs pydantic-settings 2.16.3 (prototype)\n")
    print("Command: `.venv/bin/python -m benchmarks.config.compare` (pydantic-settings installed by hand).\n")
    print("| | lines |\n|---|---|")
    print(f"| today: loader.py + sections.py + values.py | {current} |")
    print(f"| prototype file (models, YAML source, one-line formatter) | {prototype} |")
    print(f"| + values.py without the coercion it replaces ({', '.join(sorted(REPLACED_IN_VALUES))}) | {values} |")
    print(f"| + kept from sections.py / loader.py (methods, cross-checks, Kafka checks, YAML errors, typos) | {kept} |")
    change = f"{after - current:+d}, {100 * (after - current) / current:+.0f} %"
    print(f"| **with pydantic-settings** | **{after}** ({change}) |")
    print("\n## Error messages, side by side\n")
    print("| bad setting | today | pydantic (first error, formatted to one line) | pydantic raw lines |")
    print("|---|---|---|---|")
    for name, text in BAD.items():
        tmp.write_text(text)
        message, raw = pydantic(tmp)
        cells = [name, today(tmp), message, str(raw)]
        print("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    tmp.write_text("")
    message, raw = pydantic(tmp, ENV_TYPO)
    print(f"| typo in a variable: FERRET_KAFKA_BOOTSTRAP_SERVER=a:1 | {today(tmp, ENV_TYPO)} | {message} | {raw} |")


if __name__ == "__main__":
    main()
