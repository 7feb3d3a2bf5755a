"""End to end (STYLE 13): ``ferret demo`` as a user runs it, in a subprocess, on the embedded stack.

The demo starts Tansu and Valkey, runs ``ferret run`` and ``ferret produce`` as processes of their own,
changes the budget over gRPC and reads the predictions back with an independent consumer.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from services.demo.options import REPO_ROOT, ferret_command

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _env() -> dict[str, str]:
    """The caller's environment without FERRET_* settings (a developer's config must not leak in)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FERRET_")}


def test_demo_streams_changes_the_budget_and_reports(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    argv = [*ferret_command(), "demo", "--items", "300", "--dataset", "digits", "--model", "mlp", "--no-live"]
    # the paper's rate (t^d = max t_f): a plan with several workers, so the mid-stream budget cut has
    # something to cut. At the demo's own 50/s one unsplit worker keeps up and is already the smallest
    # plan (docs/planner.md reading 10): the default cut then leaves the plan as it is.
    env = {**_env(), "FERRET_TRAINER_ARRIVAL_INTERVAL": "auto"}
    began = time.monotonic()
    done = subprocess.run(
        [*argv, "--out", str(out)], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240
    )
    seconds = time.monotonic() - began
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}\n{done.stdout[-2000:]}"

    summary = json.loads((out / "summary.json").read_text())
    assert summary["ok"] and summary["complete"]
    assert summary["items_produced"] == 300
    assert summary["samples_counted_from_topic"] == 300
    assert summary["predictions_counted_from_topic"] == summary["items_produced"]
    assert summary["predictions_published"] >= 300
    assert summary["dlq"] == 0 and summary["dlq_counted_from_topic"] == 0
    [change] = summary["budget_changes"]
    assert change["from"] is None and change["to"] < summary["planned_bytes_before"]
    assert change["plan_changed"] and change["plan_version_after"] == change["plan_version_before"] + 1
    assert summary["plans"]["after"] != summary["plans"]["before"]
    assert summary["plans"]["after"]["budget_bytes"] == change["to"]
    assert summary["planned_bytes"] <= change["to"]
    assert summary["snapshots"]["requested"]["version"] >= 1
    assert summary["snapshots"]["in_redis"] and all(s["valid"] for s in summary["snapshots"]["in_redis"])
    assert summary["trainer_exit_code"] == 0 and summary["producer_exit_code"] == 0
    assert summary["latency_ms_p50"] is not None and summary["latency_ms_p99"] >= summary["latency_ms_p50"]
    assert 0.0 <= summary["online_accuracy_from_topic"] <= 100.0
    assert (out / "online_accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| predictions on topic (read back, distinct) | 300 |" in (out / "report.md").read_text()
    assert "predictions on topic" in done.stdout  # the table printed at the end
    # the live plain consumer ran after Ferret on the same 300 items at the same rate, on topics of its own
    plain = summary["plain_consumer"]
    assert plain["error"] is None, plain
    assert plain["items"] == 300 and plain["labelled"] == 300 and 0 < plain["trained"] <= 300
    assert 0.0 <= plain["online_accuracy"] <= 100.0 and plain["latency_ms_p99"] >= plain["latency_ms_p50"]
    assert "plain consumer, same items and rate (live, after Ferret)" in (out / "report.md").read_text()
    _assert_all_gone(out)
    assert seconds < 120, f"the 300-item demo took {seconds:.0f} s"


# Runs argv[1:] with SIGINT ignored, as a background job of a script (`cmd &`), nohup or a CI runner
# starts it: the disposition survives exec, and Python then installs no KeyboardInterrupt handler.
_WITH_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])"
)


def test_demo_stops_every_process_on_ctrl_c(tmp_path: Path) -> None:
    """Ctrl-C stops the demo and every child, also when the demo inherited SIGINT ignored (the test's parent
    is whatever ran pytest: a full-suite run started as `… &` from a script left the demo deaf to SIGINT,
    docs/reliability.md "Ctrl-C ignored"); SIGINT at its default goes through the same handler
    (tests/unit/test_demo_signals.py)."""
    out = tmp_path / "demo"
    argv = [*ferret_command(), "demo", "--items", "100000", "--dataset", "digits", "--model", "mlp", "--no-live"]
    process = subprocess.Popen(  # ferret_command() is an absolute path (execv needs one)
        [sys.executable, "-c", _WITH_SIGINT_IGNORED, *argv, "--out", str(out)],
        cwd=REPO_ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 120
    try:
        while not any("predicted" in line and "predicted 0 " not in line for line in seen):
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, "the demo exited before streaming:\n" + "".join(seen[-30:])
            seen.append(line)
        process.send_signal(signal.SIGINT)
        # Within the demo's own bounds: the producer's stop (10 s), the trainer's SIGTERM drain, snapshot and
        # commit (60 s), the broker's and Redis's (5 s each), with room for a loaded machine. On a timeout the
        # demo's stacks (SIGUSR1, faulthandler) and signal masks say where and why it waits.
        try:
            code = process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            masks = _signal_masks(process.pid)
            process.send_signal(signal.SIGUSR1)  # the demo prints every thread's stack (faulthandler)
            time.sleep(2.0)
            while not lines.empty():  # what the demo said after Ctrl-C, the stacks last
                said = lines.get_nowait()
                if said is not None:
                    seen.append(said)
            tail = "".join(seen[-200:])
            raise AssertionError(
                f"the demo did not stop within 180 s of Ctrl-C ({masks}); its last lines:\n{tail}"
            ) from None
        assert code == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    _assert_all_gone(out)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["error"] == "interrupted" and not summary["complete"]


def _signal_masks(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks, as /proc shows them."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as exc:
        return f"no /proc status: {exc}"
    return ", ".join(line for line in status if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


def _gone(pid: int) -> bool:
    """No such process, or a zombie left for its new parent (init or a subreaper) to reap."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _wait_for_pids(out: Path, names: set[str], process: subprocess.Popen[str], timeout: float = 120) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the demo exited with {process.returncode} before starting {names}"
        try:
            pids: dict[str, int] = json.loads((out / "pids.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            pids = {}
        if names <= pids.keys():
            return pids
        time.sleep(0.2)
    raise AssertionError(f"{names} not all started within {timeout} s")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="children die with the demo via PR_SET_PDEATHSIG")
def test_a_killed_demo_takes_its_children_with_it(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to clean up: the kernel kills the broker, Redis, trainer, producer."""
    out = tmp_path / "demo"
    argv = [*ferret_command(), "demo", "--items", "100000", "--dataset", "digits", "--model", "mlp", "--no-live"]
    process = subprocess.Popen(
        [*argv, "--out", str(out)], cwd=REPO_ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        text=True,
    )  # fmt: skip
    try:
        pids = _wait_for_pids(out, {"kafka", "redis", "trainer", "producer"}, process)
        time.sleep(1.0)  # mid-stream
        assert not [name for name, pid in pids.items() if _gone(pid)], "a child exited before the kill"
        process.send_signal(signal.SIGKILL)
        process.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids.values()):
            time.sleep(0.05)
        alive = [f"{name} ({pid})" for name, pid in pids.items() if not _gone(pid)]
        assert not alive, f"left running after the demo was SIGKILLed: {alive}"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for pid in json.loads((out / "pids.json").read_text()).values() if (out / "pids.json").exists() else []:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def test_keep_stack_leaves_broker_redis_and_trainer_running(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    argv = [*ferret_command(), "demo", "--items", "60", "--rate", "200", "--dataset", "digits", "--model", "mlp"]
    done = subprocess.run(
        [*argv, "--no-live", "--keep-stack", "--out", str(out)],
        cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    kept: dict[str, object] = json.loads((out / "stack.json").read_text()) if (out / "stack.json").exists() else {}
    pids: dict[str, int] = kept.get("pids", {})  # type: ignore[assignment]
    try:
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-4000:]}"
        assert set(pids) == {"kafka", "redis", "trainer"}
        assert all(not _gone(pid) for pid in pids.values()), "--keep-stack must leave them running"
        assert f"ferret control --target {kept['control_target']} status" in done.stdout
        assert "kcat" in done.stdout and f"kill {' '.join(map(str, pids.values()))}" in done.stdout
        status = subprocess.run(
            [*ferret_command(), "control", "--target", str(kept["control_target"]), "status", "--json"],
            cwd=REPO_ROOT, env=_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert status.returncode == 0, status.stderr
        assert int(json.loads(status.stdout)["predictions_published"]) >= 60
        summary = json.loads((out / "summary.json").read_text())
        assert summary["predictions_counted_from_topic"] == 60 and summary["producer_exit_code"] == 0
    finally:
        for pid in pids.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(_gone(pid) for pid in pids.values()):
            time.sleep(0.1)
        for pid in pids.values():
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


def _assert_all_gone(out: Path) -> None:
    """Every process the demo started (trainer, producer, broker, Redis) has exited."""
    pids = json.loads((out / "pids.json").read_text())
    assert {"trainer", "producer", "kafka", "redis"} <= pids.keys()
    alive = []
    for name, pid in pids.items():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        alive.append(f"{name} ({pid})")
    assert not alive, f"left running: {alive}"
