"""``ferret control`` against a running control plane: exit statuses (in subprocesses) and output."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ferret_core.plan import Plan
from services.cli.main import EXIT_FAILURE, EXIT_INFEASIBLE, EXIT_OK, EXIT_USAGE, main
from services.control.server import ControlServer, create_server

from .control_fakes import FULL_BYTES, MIN_BYTES, PLANNER, FakeTrainer

ROOT = Path(__file__).resolve().parents[2]
MID_BYTES = (MIN_BYTES + FULL_BYTES) // 2


@pytest.fixture
def control() -> Iterator[ControlServer]:
    server = create_server(PLANNER, FakeTrainer(PLANNER.plan(None)), token="tok").start()
    yield server
    server.stop(grace_s=1.0)


def ferret(control: ControlServer, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    status = main(["control", "--target", control.target, "--token", "tok", *args])
    out, err = capsys.readouterr()
    return status, out, err


def test_exit_statuses_in_subprocesses(control: ControlServer) -> None:
    cases = {
        "ok": (["budget", "40MB"], EXIT_OK),
        "infeasible": (["budget", str(MIN_BYTES - 1)], EXIT_INFEASIBLE),
        "invalid": (["budget", "0"], EXIT_USAGE),
    }
    env_token = {"FERRET_CONTROL_TOKEN": "tok", "PATH": "/usr/bin:/bin"}

    def start(args: list[str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "control", "--target", control.target, *args],
            cwd=ROOT,
            env=env_token,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # Two budget requests in flight at once race for the re-planner (the newer one supersedes the older:
    # ABORTED, by design), so the two that take a generation run one after the other; "invalid" is
    # refused before it takes one and runs beside them.
    results = {}
    invalid = start(cases["invalid"][0])
    for name in ("infeasible", "ok"):
        proc = start(cases[name][0])
        results[name] = (proc.wait(60), *proc.communicate())
    results["invalid"] = (invalid.wait(60), *invalid.communicate())
    for name, (_, expected) in cases.items():
        assert results[name][0] == expected, (name, results[name])
    assert "Applied v2" in results["ok"][1]
    assert "FAILED_PRECONDITION" in results["infeasible"][2] and str(MIN_BYTES) in results["infeasible"][2]
    # the minimum comes from the rich error details, not from parsing the message
    assert f"[minimum feasible budget: {MIN_BYTES} bytes" in results["infeasible"][2]
    assert len(results["infeasible"][2].strip().splitlines()) == 1
    assert "INVALID_ARGUMENT" in results["invalid"][2]


def test_usage_errors_exit_2(control: ControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["budget", "-5"], ["restore", "zero"], ["frobnicate"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["control", "--target", control.target, *args])
        assert exit_info.value.code == EXIT_USAGE
    status, _, err = ferret(control, capsys, "snapshot", "--meta", "novalue")
    assert status == EXIT_USAGE and "KEY=VALUE" in err


def test_plan_and_budget_output(control: ControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = ferret(control, capsys, "plan")
    assert status == EXIT_OK and "Plan v1 for golden" in out and "unconstrained (M+)" in out
    status, out, _ = ferret(control, capsys, "budget", str(MID_BYTES), "--json")
    data = json.loads(out)
    assert status == EXIT_OK and data["plan_version"] == 2 and data["planning_seconds"] > 0
    assert Plan.from_dict(data) == PLANNER.plan(MID_BYTES)
    status, out, _ = ferret(control, capsys, "plan", "--json")
    assert json.loads(out)["budget_bytes"] == MID_BYTES


def test_budget_none_goes_back_to_unconstrained(control: ControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = ferret(control, capsys, "budget", str(MID_BYTES))
    assert status == EXIT_OK and "Applied v2" in out and "unconstrained" not in out
    status, out, _ = ferret(control, capsys, "budget", "none")
    assert status == EXIT_OK and "Applied v3" in out and "budget unconstrained (M+)" in out
    status, out, _ = ferret(control, capsys, "budget", "Unconstrained", "--json")
    data = json.loads(out)
    assert status == EXIT_OK and data["plan_version"] == 4 and data["budget_bytes"] is None
    assert Plan.from_dict(data) == PLANNER.plan(None)
    status, out, _ = ferret(control, capsys, "status")
    assert "memory       budget unconstrained," in out
    with pytest.raises(SystemExit) as exit_info:  # neither bytes nor a word for no budget
        main(["control", "--target", control.target, "budget", "nothing"])
    assert exit_info.value.code == EXIT_USAGE
    assert "none / unconstrained" in capsys.readouterr().err


def test_status_watch_and_snapshots_output(control: ControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = ferret(control, capsys, "status")
    assert status == EXIT_OK and "state running" in out and "online accuracy 50.00 %" in out
    status, out, _ = ferret(control, capsys, "status", "--json")
    assert json.loads(out)["items_received"] == "20"  # int64 is a string in proto JSON
    status, out, _ = ferret(control, capsys, "watch", "--interval", "0.01", "--count", "2")
    assert status == EXIT_OK and len(out.strip().splitlines()) == 3  # header + 2 updates
    status, out, _ = ferret(control, capsys, "snapshots")
    assert status == EXIT_OK and "no snapshots" in out
    status, out, _ = ferret(control, capsys, "snapshot", "--meta", "why=test")
    assert status == EXIT_OK and out.startswith("snapshot v1 written")
    status, out, _ = ferret(control, capsys, "snapshots")
    assert "latest valid: 1" in out
    status, out, _ = ferret(control, capsys, "restore", "latest")
    assert status == EXIT_OK and out.startswith("restored snapshot v1") and "Plan v2" in out
    status, _, err = ferret(control, capsys, "restore", "9")
    assert status == EXIT_FAILURE and "NOT_FOUND" in err


def test_unreachable_or_unauthenticated_is_exit_1(control: ControlServer, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["control", "--target", control.target, "--token", "nope", "plan"])
    assert status == EXIT_FAILURE and "UNAUTHENTICATED" in capsys.readouterr().err
    status = main(["control", "--target", "127.0.0.1:1", "--timeout", "2", "status"])
    err = capsys.readouterr().err
    assert status == EXIT_FAILURE and "UNAVAILABLE" in err and len(err.strip().splitlines()) == 1
