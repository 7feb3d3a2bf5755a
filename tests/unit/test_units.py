"""``services.units``: the value types config, trainer, demo and CLI share; and the CLI stays on the roof
(nothing below it imports ``services.cli``, STYLE worked example 6)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from services.units import ArrivalInterval, format_bytes, parse_bytes, parse_rate

SERVICES = Path(__file__).resolve().parents[2] / "services"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2429288", 2429288), ("512MiB", 512 * 2**20), ("2GB", 2 * 10**9), ("1.5 KiB", 1536), ("0", 0)],
)
def test_parse_bytes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "12XB", "-1", "MiB", "1e400"])
def test_parse_bytes_rejects_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="invalid byte size"):
        parse_bytes(text)


def test_format_bytes() -> None:
    assert [format_bytes(v) for v in (512, 1536, 3 * 2**20, 5 * 2**30)] == ["512 B", "1.50 KiB", "3.00 MiB", "5.00 GiB"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("auto", 0.002), ("AUTO", 0.002), ("2x", 0.004), ("0.5x", 0.001), ("0.02", 0.02)],
)
def test_arrival_interval_parses_and_resolves(text: str, seconds: float) -> None:
    interval = ArrivalInterval.parse(text)
    assert interval.resolve(0.002) == pytest.approx(seconds)
    assert ArrivalInterval.parse(str(interval)) == interval  # str() round-trips


@pytest.mark.parametrize("text", ["", "0", "-1", "0x", "fastx", "nan", "inf"])
def test_arrival_interval_rejects_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match="'auto'"):
        ArrivalInterval.parse(text)


def test_parse_rate() -> None:
    assert parse_rate("max") is None and parse_rate(" MAX ") is None
    assert parse_rate("50") == 50.0
    for bad in ("0", "-3", "nan", "inf", "fast"):
        with pytest.raises(ValueError, match="items per second"):
            parse_rate(bad)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_nothing_below_the_cli_imports_it() -> None:
    below = [p for p in SERVICES.rglob("*.py") if "cli" not in p.relative_to(SERVICES).parts[:1]]
    assert below
    offenders = sorted(
        f"{p.relative_to(SERVICES)} imports {name}"
        for p in below
        for name in _imports(p)
        if name == "services.cli" or name.startswith("services.cli.")
    )
    assert offenders == []
