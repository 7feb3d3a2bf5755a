"""The record path's priority below its executors' (``services/trainer/priority.py``): every thread of the
process lowered, threads started later too, and a process the executors' forkserver forks afterwards at
the priority the process had before (the forkserver was started first)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from services.trainer.priority import NICE_MAX, RecordPathPriority, lower_record_path_priority, thread_ids

ROOT = Path(__file__).resolve().parents[2]
linux_only = pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="per-thread nice values are Linux's")

PROBE = textwrap.dedent(
    """
    import json, os, sys, threading

    from ferret_core.engine.processes.executor import START_METHOD, start_executor_parent
    from services.trainer.priority import lower_record_path_priority


    def nice_of(tid):
        return os.getpriority(os.PRIO_PROCESS, tid)


    def child_nice(queue):
        queue.put(os.getpriority(os.PRIO_PROCESS, 0))


    if __name__ == "__main__":
        import torch.multiprocessing as tmp

        before = os.getpriority(os.PRIO_PROCESS, 0)
        release = threading.Event()
        early = threading.Thread(target=release.wait, daemon=True)  # a thread that exists when it is lowered
        early.start()
        start_executor_parent()
        done = lower_record_path_priority(int(sys.argv[1]))
        threads = {int(t): nice_of(int(t)) for t in os.listdir("/proc/self/task")}
        later = []
        thread = threading.Thread(target=lambda: later.append(os.getpriority(os.PRIO_PROCESS, 0)))
        thread.start()
        thread.join()
        ctx = tmp.get_context(START_METHOD)
        queue = ctx.SimpleQueue()
        child = ctx.Process(target=child_nice, args=(queue,))
        child.start()
        child.join(60)
        forked = queue.get()
        release.set()
        print(json.dumps({
            "before": before, "after": done.nice_after, "reported_before": done.nice_before,
            "set_on": done.threads, "threads": sorted(threads.values()), "later": later[0], "forked": forked,
        }))
    """
)


def run_probe(tmp_path: Path, increment: int) -> dict[str, object]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(probe), str(increment)], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@linux_only
def test_every_thread_is_lowered_and_the_executors_forkserver_keeps_the_priority_it_started_with(
    tmp_path: Path,
) -> None:
    found = run_probe(tmp_path, 3)
    before = found["before"]
    assert isinstance(before, int)
    expected = min(NICE_MAX, before + 3)
    assert found["reported_before"] == before and found["after"] == expected
    threads = found["threads"]
    assert isinstance(threads, list) and len(threads) >= 2  # the main thread and the early one at least
    assert set(threads) == {expected}  # every thread, the one started before the call too
    assert found["set_on"] == len(threads)
    assert found["later"] == expected  # a thread started afterwards takes its creator's value
    assert found["forked"] == before  # an executor forked afterwards: the priority the forkserver started with


@linux_only
def test_the_increment_is_capped_at_the_lowest_priority(tmp_path: Path) -> None:
    found = run_probe(tmp_path, 40)
    assert found["after"] == NICE_MAX and set(found["threads"]) == {NICE_MAX}  # type: ignore[arg-type]


def test_a_negative_increment_is_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        lower_record_path_priority(-1)


def test_no_thread_list_where_the_kernel_has_none(tmp_path: Path) -> None:
    assert thread_ids(tmp_path / "missing") is None
    (tmp_path / "tasks" / "12").mkdir(parents=True)
    (tmp_path / "tasks" / "7").mkdir()
    assert thread_ids(tmp_path / "tasks") == [7, 12]


def test_the_description_says_what_runs_first() -> None:
    assert "nothing to lower" in RecordPathPriority(19, 19, 3, per_thread=True).describe()
    text = RecordPathPriority(0, 10, 24, per_thread=True).describe()
    assert text.startswith("record path at nice 10 (24 threads), its executor processes at 0")
    assert "(the process)" in RecordPathPriority(0, 5, 1, per_thread=False).describe()
