"""The README's quick start stays true: its two commands exist, CI runs the test one, and every
``ferret`` command it names is registered."""

from __future__ import annotations

import re
from pathlib import Path

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
