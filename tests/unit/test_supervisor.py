"""``ferret run --supervise`` (services/supervisor.py): a child that fails is restarted with backoff until
it exits cleanly; usage errors and infeasible budgets are not restarted; too many failures end it; a stop
reaches the child and ends supervision; the child is told its restart count."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from services.supervisor import RESTARTS_ENV, RestartPolicy, Supervisor

FAST = RestartPolicy(max_restarts=3, window_s=60.0, first_backoff_s=0.01, max_backoff_s=0.02)


def child(codes: list[int], log: Path) -> list[str]:
    """A child that appends its restart count to ``log`` and exits with ``codes[run]`` (the last one after)."""
    script = (
        "import os, sys; from pathlib import Path\n"
        f"log = Path({str(log)!r}); runs = log.read_text().split() if log.exists() else []\n"
        f"log.write_text(' '.join([*runs, os.environ[{RESTARTS_ENV!r}]]))\n"
        f"codes = {codes!r}; sys.exit(codes[min(len(runs), len(codes) - 1)])\n"
    )
    return [sys.executable, "-c", script]


def test_a_failing_child_is_restarted_until_it_exits_cleanly(tmp_path: Path) -> None:
    log = tmp_path / "runs"
    supervisor = Supervisor(child([1, 1, 0], log), policy=FAST)
    assert supervisor.run() == 0
    assert supervisor.restarts == 2 and supervisor.exit_codes == [1, 1, 0]
    assert log.read_text().split() == ["0", "1", "2"]  # each run knew its restart count


def test_usage_errors_and_infeasible_budgets_are_not_restarted(tmp_path: Path) -> None:
    for code in (2, 3):
        supervisor = Supervisor(child([code, 0], tmp_path / f"runs-{code}"), policy=FAST)
        assert supervisor.run() == code and supervisor.restarts == 0, supervisor.exit_codes


def test_too_many_failures_end_supervision_with_the_childs_code(tmp_path: Path) -> None:
    supervisor = Supervisor(child([1], tmp_path / "runs"), policy=FAST)
    assert supervisor.run() == 1
    assert supervisor.restarts == FAST.max_restarts and len(supervisor.exit_codes) == FAST.max_restarts + 1


def test_backoff_doubles_up_to_its_cap(tmp_path: Path) -> None:
    waits: list[float] = []
    policy = RestartPolicy(max_restarts=4, first_backoff_s=1.0, max_backoff_s=3.0)
    supervisor = Supervisor(child([1], tmp_path / "runs"), policy=policy, sleep=lambda s: waits.append(s) or False)
    supervisor.run()
    assert waits == [1.0, 2.0, 3.0, 3.0]


def test_a_stop_reaches_the_child_and_ends_supervision(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    supervisor = Supervisor(sleeper, policy=FAST)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(supervisor.run()))
    thread.start()
    deadline = time.monotonic() + 10
    while supervisor._child is None and time.monotonic() < deadline:
        time.sleep(0.01)
    supervisor.stop()
    thread.join(10)
    assert not thread.is_alive() and result and result[0] != 0  # the child died of SIGTERM: not restarted
    assert supervisor.restarts == 0


def test_the_child_does_not_outlive_a_killed_supervisor(tmp_path: Path) -> None:
    marker = tmp_path / "child.pid"
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    runner = tmp_path / "supervise.py"
    runner.write_text(
        "import sys\nfrom services.supervisor import Supervisor\n"
        f"Supervisor([sys.executable, {str(sleeper)!r}]).run()\n"
    )
    root = Path(__file__).resolve().parents[2]
    supervisor = subprocess.Popen([sys.executable, str(runner)], env={**os.environ, "PYTHONPATH": str(root)})
    deadline = time.monotonic() + 20
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline, "the supervised child did not start"
        time.sleep(0.05)
    child = int(marker.read_text())
    supervisor.send_signal(signal.SIGKILL)
    supervisor.wait(10)
    deadline = time.monotonic() + 10
    while alive(child):
        assert time.monotonic() < deadline, "the child outlived its killed supervisor"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
