"""A process clock over two "hosts": two ``torchrun`` launchers meeting through c10d rendezvous on
loopback (``--nnodes 2 --rdzv-backend c10d``), as two machines would; the job is ``hosts_job.py``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
JOB = Path(__file__).with_name("hosts_job.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_job(scenario: str, tmp_path: Path, timeout: float = 180.0, *, succeed: bool = True) -> dict[str, Any]:
    """Start two launchers (one per "host"), wait for both, return the coordinator's result (and, where
    the job is to ``succeed``, check that it and both launchers did)."""
    out = tmp_path / f"{scenario}.json"
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    argv = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--nproc-per-node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"ferret-{scenario}",
        "--max-restarts", "0",
        str(JOB), scenario, str(out),
    ]  # fmt: skip
    launchers = [
        subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]
    deadline = time.monotonic() + timeout
    logs = []
    for launcher in launchers:
        try:
            logs.append(launcher.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
        except subprocess.TimeoutExpired:
            for other in launchers:
                other.kill()
            raise
    codes = [launcher.returncode for launcher in launchers]
    assert out.exists(), f"no result; launchers exited {codes}\n" + "\n---\n".join(logs)
    result: dict[str, Any] = json.loads(out.read_text())
    result["launcher_codes"] = codes
    result["seconds"] = time.monotonic() - (deadline - timeout)
    if succeed:
        assert result["ok"], result.get("traceback")
        assert codes == [0, 0], f"launchers exited {codes}\n" + "\n---\n".join(logs)
    return result


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_one_worker_over_stages_on_two_hosts_equals_plain_sgd(tmp_path: Path) -> None:
    """Transparency across hosts: stage 0 on the coordinator's host, stages 1 and 2 owned by the other,
    activations and gradients over gloo between them; the weights equal plain SGD's exactly (asserted in
    the job), every stage updated once per item, the trace valid, the followers at the owners' masters."""
    result = run_job("transparency", tmp_path)
    assert result["world_size"] == 2
    assert result["updates"] == [[20, 20, 20]]
    assert result["follower_versions"] == [20, 20, 20]
    assert all(_gone(pid) for pid in result["pids"].values())


def test_a_saturated_pipeline_over_two_hosts_validates_and_reports_freshness(tmp_path: Path) -> None:
    result = run_job("saturated", tmp_path)
    fresh = result["freshness"]
    assert fresh["predictions"] == 200
    assert result["trained"] > 0
    assert [e[:2] for e in result["executors"]] == [[0, 0], [0, 1], [1, 0], [1, 1]]
    assert all(pid > 0 for *_, pid in result["executors"])
    assert fresh["updates_max"] >= 0 and fresh["ms_max"] >= 0.0
    assert result["shared_bytes"] > 0


def test_a_killed_executor_on_another_host_fails_the_clock_within_seconds(tmp_path: Path) -> None:
    result = run_job("killed", tmp_path)
    assert result["error"] is not None and "ExecutorLost" in result["error"], result
    assert result["seconds_to_error"] < 5.0
    assert result["seconds_to_closed"] < 10.0
    assert _gone(result["pids"][0])
    assert result["after"] == [[20, 20, 20]]  # the host serves the next clock


def test_a_killed_coordinator_ends_the_other_hosts_agent_and_executors(tmp_path: Path) -> None:
    """No orphan: the host hears nothing from the killed coordinator for LOST_AFTER_S, ends its
    executors and exits; both launchers report the failure."""
    result = run_job("coordinator_killed", tmp_path, succeed=False)
    assert all(code != 0 for code in result["launcher_codes"]), result
    assert all(_gone(pid) for pid in [result["agent"], *result["executors"]]), result
