"""The README's quick start stays true: its two commands exist, CI runs the test one, and every
``ferret`` command it names is registered."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from services.cli.main import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_quick_start_commands_exist_and_ci_runs_the_test_command() -> None:
    block = README.split("## Quick start", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["bash scripts/main.sh", "bash scripts/test.sh"]
    for command in commands:
        assert (ROOT / command.split()[1]).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_every_documented_command_is_registered() -> None:
    documented = set(re.findall(r"`ferret (\w+)", README))
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    assert documented and documented <= set(subparsers.choices)  # type: ignore[arg-type]


def section_commands(title: str) -> list[str]:
    block = README.split(f"## {title}", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    return [line.split(" #")[0].strip() for line in block.strip().splitlines() if line.strip()]


@pytest.mark.slow
def test_your_own_model_commands_work_as_written() -> None:
    """The README's "Your own model" commands, run in order from the repository root as a user would."""
    commands = section_commands("Your own model")
    assert [c.split()[:2] for c in commands] == [[".venv/bin/ferret", v] for v in ("profile", "plan", "simulate")]
    for command in commands:
        argv = shlex.split(command)
        if not (ROOT / argv[0]).is_file():  # another environment runs the tests: the same CLI, by module
            argv = [sys.executable, "-m", "services.cli.main", *argv[1:]]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}  # a shared 2-core machine: one torch thread is faster
        out = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, f"{command}\n{out.stderr[-3000:]}"
    assert "examples.custom_cnn:build" in (ROOT / "out" / "custom_cnn.json").read_text()


def test_downstream_commands_parse_and_are_run_by_the_integration_tier() -> None:
    """The README's "Downstream" commands are ferret commands the CLI accepts; they run, as written,
    against a live trainer in tests/integration/test_downstream.py (which needs the broker)."""
    commands = section_commands("Downstream")
    assert len(commands) >= 3 and all(c.startswith(".venv/bin/ferret predictions tail") for c in commands)
    parser = build_parser()
    for command in commands:
        argv = shlex.split(command.split(" > ")[0])[1:]
        args = parser.parse_args(argv)
        assert args.command == "predictions" and args.action == "tail"
    python = README.split("## Downstream", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    compile(python, "README.md", "exec")
    assert "iter_predictions" in python and "to_dataframe" in python
    runner = (ROOT / "tests" / "integration" / "test_downstream.py").read_text()
    assert "def test_the_readme_downstream_commands_work_as_written" in runner
