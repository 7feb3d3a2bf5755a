"""The command line as a user meets it: ``--version``, help text with defaults on every flag, no help
naming a command that does not exist, JSON logs, a closed pipe ending quietly, strict JSON files."""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from services import strict_json
from services.cli.logs import configure_logging
from services.cli.main import DISTRIBUTION, EXIT_BROKEN_PIPE, build_parser, main
from services.control.server import ControlServer, create_server
from services.demo.report import write_report

from .control_fakes import PLANNER, FakeTrainer
from .test_demo_report import run_record, status

ROOT = Path(__file__).resolve().parents[2]
VALUE_ACTIONS = (argparse._StoreAction, argparse._AppendAction)


def every_parser(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ("ferret",)
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_parser(sub, (*path, name))


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert re.match(rf"ferret \d+\.\d+\.\d+\S* \({DISTRIBUTION}, Python 3\.\d+", out), out


def test_every_action_of_every_command_has_help_and_flags_say_their_default() -> None:
    missing, no_default = [], []
    for path, parser in every_parser(build_parser()):
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for group in subparsers:
            listed = {choice.dest for choice in group._choices_actions}
            missing += [f"{' '.join(path)} {name}" for name in group.choices if name not in listed]
            missing += [f"{' '.join(path)} {c.dest}" for c in group._choices_actions if not c.help]
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            where = f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}"
            if not action.help:
                missing.append(where)
            elif action.option_strings and isinstance(action, VALUE_ACTIONS) and not action.required:
                said = "default" in action.help.lower() or str(action.default) in action.help
                if not said:
                    no_default.append(f"{where}: {action.help}")
    assert not missing, f"without help: {missing}"
    assert not no_default, f"help without the default: {no_default}"


def test_help_names_only_commands_that_exist() -> None:
    commands = set(next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices)
    named: dict[str, str] = {}
    for path, parser in every_parser(build_parser()):
        texts = [parser.description or "", parser.epilog or ""] + [a.help or "" for a in parser._actions]
        for text in texts:
            for command in re.findall(r"ferret (?:[a-z]+/)*([a-z]+)", text):
                named[command] = " ".join(path)
            for group in re.findall(r"ferret ((?:[a-z]+/)+[a-z]+)", text):
                for command in group.split("/"):
                    named[command] = " ".join(path)
    unknown = {c: where for c, where in named.items() if c not in commands}
    assert not unknown, f"help names commands that do not exist: {unknown}"
    assert "bench" in build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]


def test_json_logs_are_strict_json_lines() -> None:
    stream = io.StringIO()
    configure_logging("INFO", "json", stream=stream)
    log = logging.getLogger("ferret.test")
    try:
        log.info("replanned in %.1f ms", 2.5, extra={"budget_bytes": 1024, "ratio": math.nan})
        try:
            raise ValueError("bad record")
        except ValueError:
            log.exception("dead-lettered")
    finally:
        configure_logging("WARNING", "text")
    first, second = (json.loads(line, parse_constant=_reject) for line in stream.getvalue().splitlines())
    assert first["message"] == "replanned in 2.5 ms" and first["level"] == "INFO" and first["logger"] == "ferret.test"
    assert first["budget_bytes"] == 1024 and first["ratio"] is None and first["time"].endswith("+00:00")
    assert second["level"] == "ERROR" and "ValueError: bad record" in second["exception"]


def test_services_take_log_format_json() -> None:
    parser = build_parser()
    for command in ("run", "produce", "demo"):
        args = parser.parse_args([command, "--log-format", "json", *(["--dataset", "digits"] * (command == "produce"))])
        assert args.log_format == "json", command
    with pytest.raises(SystemExit):
        parser.parse_args(["run", "--log-format", "xml"])


def _reject(constant: str) -> None:
    raise AssertionError(f"not strict JSON: {constant}")


def test_reports_and_timeline_are_strict_json(tmp_path: Path) -> None:
    record = run_record(tmp_path)
    record.timeline.append(status(online_accuracy=math.nan, lag_seconds=math.inf, latency_ms_p99=-math.inf))
    write_report(tmp_path, record, None)
    for name in ("summary.json", "timeline.json"):
        json.loads((tmp_path / name).read_text(), parse_constant=_reject)
    last = json.loads((tmp_path / "timeline.json").read_text())[-1]
    assert last["online_accuracy"] is None and last["lag_seconds"] is None and last["latency_ms_p99"] is None
    assert strict_json.dumps({"a": [1.5, math.nan, {"b": math.inf}]}) == '{"a": [1.5, null, {"b": null}]}'


@pytest.fixture
def control() -> Iterator[ControlServer]:
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(None))).start()
    yield server
    server.stop(grace_s=1.0)


def test_a_closed_pipe_ends_quietly(control: ControlServer) -> None:
    """`ferret control watch --json | head -n 2`: two lines, no traceback, status 141 (128 + SIGPIPE)."""
    ferret = f"{sys.executable} -m services.cli.main control --target {control.target}"
    script = f'{ferret} watch --json --interval 0.01 | head -n 2; echo "status=${{PIPESTATUS[0]}}" >&2'
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert len(lines) == 2 and all(json.loads(line)["state"] for line in lines)
    assert out.stderr.strip() == f"status={EXIT_BROKEN_PIPE}", out.stderr
