"""A job of several "hosts" on this machine: one ``torchrun`` launcher per host, meeting through c10d
rendezvous on loopback, as separate machines would (tests and benchmarks)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class LoopbackRun:
    """Each launcher's exit status and output, and the seconds from start to the last exit."""

    codes: list[int]
    logs: list[str]
    seconds: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun_argv(nodes: int, port: int, run_id: str) -> list[str]:
    """One launcher of a ``nodes``-host job that meets at 127.0.0.1:``port`` (no restarts)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(nodes), "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--max-restarts", "0",
    ]  # fmt: skip


def run_on_loopback(
    program: Sequence[str], *, nodes: int = 2, timeout: float = 300.0, run_id: str = "ferret"
) -> LoopbackRun:
    """Run ``program`` (a script path or ``-m module`` and its arguments) under ``nodes`` launchers on
    loopback and wait for all of them (killed at ``timeout``: raises :class:`subprocess.TimeoutExpired`)."""
    argv = [*torchrun_argv(nodes, free_port(), run_id), *program]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    t0 = time.monotonic()
    launchers = [
        subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(nodes)
    ]
    logs = []
    try:
        for launcher in launchers:
            logs.append(launcher.communicate(timeout=max(1.0, t0 + timeout - time.monotonic()))[0])
    except subprocess.TimeoutExpired:
        for launcher in launchers:
            launcher.kill()
        raise
    return LoopbackRun([launcher.returncode for launcher in launchers], logs, time.monotonic() - t0)
