"""What several benchmark scripts share: a synthetic labelled stream for memory measurements and a
``ferret simulate --json`` run in its own process. Scripts import it as ``benchmarks.support`` (they run as
modules from the repository root: ``python -m benchmarks.<topic>.<script>``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Item:
    """One stream item as the engine takes it."""

    x: torch.Tensor
    y: int | None


def stream(shape: tuple[int, ...], classes: int, count: int) -> list[Item]:
    """``count`` uniform random inputs of ``shape`` with random labels (seed 0): memory depends on shapes,
    not on the values."""
    g = torch.Generator().manual_seed(0)
    return [Item(torch.rand(shape, generator=g), int(torch.randint(classes, (1,), generator=g))) for _ in range(count)]


def simulate_json(args: list[str]) -> dict[str, Any]:
    """``ferret simulate ARGS --json`` in a fresh process from the repository root: its report plus the
    ``command`` (as a user would type it) and ``process_seconds``; exits with its stderr when it fails."""
    cmd = [sys.executable, "-m", "services.cli.main", "simulate", *args, "--json"]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    report["command"] = " ".join(["ferret", *cmd[3:]])
    report["process_seconds"] = time.perf_counter() - started
    return report


def short_head() -> str:
    """The repository's commit (``git rev-parse --short HEAD``), for a result's header."""
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    return done.stdout.strip()


def run_record(
    module: str, argv: list[str] | None, load_before: tuple[float, float, float], **fields: Any
) -> dict[str, Any]:
    """A result as the benchmark scripts store it: the command that made it (``.venv/bin/python -m MODULE``
    and its arguments), the commit, the CPUs and the load average before the run, then ``fields``."""
    return {
        "command": " ".join([".venv/bin/python", "-m", module, *(argv or sys.argv[1:])]),
        "commit": short_head(),
        "cpus": os.cpu_count(),
        "load_before": load_before,
        **fields,
    }


def write_result(results: Path, name: str, result: dict[str, Any], render: Any) -> str:
    """``results/NAME.json`` (the raw result) and ``results/NAME.md`` (``render(result)``); returns the Markdown."""
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    md: str = render(result)
    (results / f"{name}.md").write_text(md, encoding="utf-8")
    return md
