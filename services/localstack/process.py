"""A local server run as a child process: started with ``subprocess`` (never a bare ``fork``, which is
unsafe once torch or grpc have started threads), logging to a file, ready when a probe says so, stopped
with terminate → wait → kill, and (by default, on Linux) killed by the kernel when its parent dies, even
by SIGKILL (:mod:`services.localstack.deathsig`)."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from ferret_core.errors import FerretError
from services.localstack.ports import LOOPBACK, free_port

DEFAULT_STOP_TIMEOUT = 5.0
DEATHSIG_TRAMPOLINE = Path(__file__).with_name("deathsig.py")


def dying_with_this_process(argv: Sequence[str], signal_name: str = "KILL") -> tuple[str, ...]:
    """``argv`` started through the :mod:`~services.localstack.deathsig` trampoline: it gets SIG``signal_name``
    when this process (the thread that spawns it) dies, even of SIGKILL."""
    prefix = (sys.executable, "-I", "-S", str(DEATHSIG_TRAMPOLINE), str(os.getpid()))
    return (*prefix, *(() if signal_name == "KILL" else (signal_name,)), "--", *argv)


class LocalStackError(FerretError, RuntimeError):
    """A local server could not be started, reached or stopped."""


class BinaryNotFoundError(LocalStackError, FileNotFoundError):
    """The executable of a local server is missing."""


class ServerExitedError(LocalStackError):
    """A local server exited before it was ready (e.g. its port was taken)."""


def log_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file ("" when it does not exist)."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _reap(process: subprocess.Popen[bytes], timeout: float) -> None:
    """Terminate, wait, kill: the same path for ``stop()`` and for the interpreter exiting first."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class ChildProcess:
    """One server process with its log file.

    The child gets its own session, so a Ctrl-C meant for the parent does not reach it before the
    parent has stopped it in order; a finalizer still stops it if the parent exits without ``stop()``.
    With ``die_with_parent`` (the default) it is started through the :mod:`~services.localstack.deathsig`
    trampoline, so it also dies when the parent is killed outright (SIGKILL, OOM killer), which no
    finalizer survives; start it from a thread that outlives it (the main thread). :meth:`release`
    leaves a child started with ``die_with_parent=False`` running after the parent exits.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.argv = tuple(str(a) for a in argv)
        self.log_path = log_path
        self.die_with_parent = die_with_parent
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: weakref.finalize[..., ChildProcess] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._process.returncode if self._process is not None else None

    def start(self) -> None:
        if self._process is not None:
            raise LocalStackError(f"{self.name} was already started (pid {self._process.pid})")
        program = self.argv[0]
        path = (self._env or os.environ).get("PATH")
        if shutil.which(program, path=path) is None and not (Path(self._cwd or ".") / program).is_file():
            raise BinaryNotFoundError(f"could not start {self.name}: {program!r} is not an executable file or on PATH")
        argv = self.argv
        if self.die_with_parent:
            argv = dying_with_this_process(argv)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self._process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self._env,
                    cwd=self._cwd,
                    close_fds=True,
                    start_new_session=True,
                )
            except OSError as exc:
                raise LocalStackError(f"could not start {self.name} ({self.argv[0]}): {exc}") from exc
        self._finalizer = weakref.finalize(self, _reap, self._process, DEFAULT_STOP_TIMEOUT)

    def wait_ready(self, probe: Callable[[], bool], timeout: float, interval: float = 0.02) -> float:
        """Block until ``probe()`` is true while the process runs; return the seconds it took.

        Raises :class:`LocalStackError` with the log's tail when the process exits first or the deadline
        passes (the process is stopped then).
        """
        process = self._process
        if process is None:
            raise LocalStackError(f"{self.name} was not started")
        began = time.monotonic()
        deadline = began + timeout
        while True:
            if process.poll() is None and probe() and process.poll() is None:
                return time.monotonic() - began
            if process.poll() is not None:
                raise ServerExitedError(
                    f"{self.name} exited with status {process.returncode} before it was ready "
                    f"(command: {' '.join(self.argv)}); last lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.stop()
                raise LocalStackError(
                    f"{self.name} did not become ready within {timeout:g} s "
                    f"(command: {' '.join(self.argv)}); last lines of {self.log_path}:\n"
                    f"{log_tail(self.log_path)}"
                )
            with contextlib.suppress(subprocess.TimeoutExpired):  # sleeps, but returns when the process dies
                process.wait(timeout=min(interval, remaining))

    def release(self) -> None:
        """Leave the process running after this parent exits (no finalizer; only without die_with_parent)."""
        if self.die_with_parent:
            raise LocalStackError(f"{self.name} was started to die with its parent; it cannot be released")
        if self._finalizer is not None:
            self._finalizer.detach()

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> int | None:
        """Stop the process (SIGTERM, then SIGKILL after ``timeout``); return its exit status."""
        if self._process is None:
            return None
        _reap(self._process, timeout)
        if self._finalizer is not None:
            self._finalizer.detach()
        return self._process.returncode


class LocalServer:
    """Base of the embedded servers: a child process on a loopback port, a free one unless given.

    Subclasses say how to find the binary, the command line for a port, and when the server is ready.
    Use as a context manager or call :meth:`start` / :meth:`stop`.
    """

    name = "server"
    log_name = "server.log"
    port_attempts = 3  # an auto-chosen port may be taken between choosing and binding: retry an exit

    def __init__(
        self,
        run_dir: Path,
        *,
        host: str = LOOPBACK,
        port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        start_timeout: float = 10.0,
        die_with_parent: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.die_with_parent = die_with_parent
        self.host = host
        self._requested_port = port
        self._binary = binary
        self.start_timeout = start_timeout
        self.port: int | None = None
        self.startup_seconds: float | None = None
        self._child: ChildProcess | None = None

    def find_binary(self, explicit: str | os.PathLike[str] | None) -> Path:
        raise NotImplementedError

    def argv(self, binary: Path, port: int) -> list[str]:
        raise NotImplementedError

    def is_ready(self, port: int) -> bool:
        raise NotImplementedError

    def child_env(self) -> dict[str, str] | None:
        return None

    @property
    def log_path(self) -> Path:
        return self.run_dir / self.log_name

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    @property
    def running(self) -> bool:
        return self._child is not None and self._child.running

    def _started_port(self) -> int:
        if self.port is None:
            raise LocalStackError(f"the {self.name} is not started")
        return self.port

    def start(self) -> Self:
        if self.running:
            return self
        binary = self.find_binary(self._binary)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        attempts = 1 if self._requested_port is not None else self.port_attempts
        failure: ServerExitedError | None = None
        for _ in range(attempts):
            port = self._requested_port if self._requested_port is not None else free_port(self.host)
            child = ChildProcess(
                self.name,
                self.argv(binary, port),
                self.log_path,
                env=self.child_env(),
                die_with_parent=self.die_with_parent,
            )
            child.start()
            try:
                self.startup_seconds = child.wait_ready(functools.partial(self.is_ready, port), self.start_timeout)
            except ServerExitedError as exc:
                child.stop()
                failure = exc
                continue
            except BaseException:
                child.stop()
                raise
            self._child, self.port = child, port
            return self
        assert failure is not None
        raise failure

    def release(self) -> None:
        """Leave the server running after this process exits (see :meth:`ChildProcess.release`)."""
        if self._child is not None:
            self._child.release()

    def stop(self) -> int | None:
        """Stop the server; return its exit status (None when it was not running)."""
        status = self._child.stop() if self._child is not None else None
        self._child = None
        self.port = None
        return status

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
