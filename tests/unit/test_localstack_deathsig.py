"""Children die with their parent, even when it is SIGKILLed (services.localstack.deathsig), unless
released on purpose. Real processes; each test takes well under a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from services.localstack.process import DEATHSIG_TRAMPOLINE

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")


def gone(pid: int) -> bool:
    """No such process, or a zombie waiting for its (new) parent to reap it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if gone(pid):
            return True
        time.sleep(0.02)
    return gone(pid)


def parent_with_a_child(tmp_path: Path, *, die_with_parent: bool) -> tuple[subprocess.Popen[str], int]:
    """A Python parent that starts ``sleep 60`` as a ChildProcess and prints its pid."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from services.localstack.process import ChildProcess
        child = ChildProcess("sleeper", ["sleep", "60"], Path({str(tmp_path / "child.log")!r}),
                             die_with_parent={die_with_parent})
        child.start()
        if not {die_with_parent}:
            child.release()
        print(child.pid, flush=True)
        if {die_with_parent}:
            time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    return parent, int(parent.stdout.readline())


@linux_only
def test_a_child_dies_when_its_parent_is_sigkilled(tmp_path: Path) -> None:
    parent, child = parent_with_a_child(tmp_path, die_with_parent=True)
    try:
        time.sleep(0.2)  # the trampoline has exec'd sleep by now (or dies with the parent anyway)
        assert not gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert wait_gone(child), f"child {child} outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_a_released_child_outlives_its_parent(tmp_path: Path) -> None:
    parent, child = parent_with_a_child(tmp_path, die_with_parent=False)
    try:
        assert parent.wait(10) == 0
        time.sleep(0.2)
        assert not gone(child), "a released child must keep running after its parent exits"
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)


@linux_only
def test_the_trampoline_refuses_when_its_parent_is_already_gone() -> None:
    """PARENT_PID is not our parent: as if the parent died before prctl took effect."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(DEATHSIG_TRAMPOLINE), "1", "--", "true"], capture_output=True, timeout=30
    )
    assert out.returncode == 1


def test_the_trampoline_runs_the_program_and_reports_usage(tmp_path: Path) -> None:
    run = [sys.executable, "-I", "-S", str(DEATHSIG_TRAMPOLINE)]
    ok = subprocess.run([*run, str(os.getpid()), "--", "sh", "-c", "echo ran"], capture_output=True, text=True)
    assert (ok.returncode, ok.stdout) == (0, "ran\n")
    usage = subprocess.run([*run, "not-a-pid", "true"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stderr
    missing = subprocess.run([*run, str(os.getpid()), "--", str(tmp_path / "nope")], capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot run" in missing.stderr


@linux_only
def test_a_supervised_child_gets_sigterm_when_the_supervisor_is_sigkilled(tmp_path: Path) -> None:
    """The supervisor's trampoline asks for SIGTERM (the trainer drains and snapshots on it), set in the
    child before exec, not in a preexec_fn of a threaded parent."""
    marker = tmp_path / "terminated"
    child_code = (
        "import signal, sys, time; from pathlib import Path\n"
        f"signal.signal(signal.SIGTERM, lambda *_: (Path({str(marker)!r}).write_text('TERM'), sys.exit(0)))\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    code = textwrap.dedent(
        f"""
        import subprocess, sys, time
        from services.supervisor import with_parent_death_signal
        child = subprocess.Popen(with_parent_death_signal([sys.executable, "-c", {child_code!r}]),
                                 stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline() == "ready\\n"
        print(child.pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(5)
        assert wait_gone(child), f"child {child} outlived its SIGKILLed supervisor"
        assert marker.read_text() == "TERM"  # SIGTERM, not SIGKILL: its handler ran
    finally:
        if parent.poll() is None:
            parent.kill()
        if not gone(child):
            os.kill(child, signal.SIGKILL)


def test_the_trampoline_takes_a_signal_name() -> None:
    run = [sys.executable, "-I", "-S", str(DEATHSIG_TRAMPOLINE), str(os.getpid())]
    ok = subprocess.run([*run, "TERM", "--", "sh", "-c", "echo ran"], capture_output=True, text=True)
    assert (ok.returncode, ok.stdout) == (0, "ran\n")
    bad = subprocess.run([*run, "NOSUCH", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 2 and "usage" in bad.stderr
