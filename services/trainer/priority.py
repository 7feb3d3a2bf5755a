"""The record path's CPU priority below its executor processes' (``trainer.record_path_nice``).

On executor processes the trainer's own process is the record path (consume, decode, predict every item
with the live model and the guard's shadow, publish, commit) and each executor a process that trains. Where
the machine has no core to spare (the planner gives the executors every core but the record path's:
``services/trainer/executors.py``), the kernel's fair scheduler shares the cores between the executor
and every runnable thread beside it (the record path's, the broker's, a producer's) alike, so at saturation
the executor trains on what they leave. On the 2-core demo machine (MNIST/MNISTNet at 385 items/s, one
executor) py-spy found the executor runnable 81 % of the time and running 57 %; with the record path's
threads at nice +10 the demo trained 3,007 of 5,000 items against 2,596 at equal priority (+412 ± 12, 4
paired rounds) and its online accuracy rose by 2.1 ± 1.2 points; at 1,000 items/s +241 ± 45 items and
+5.9 ± 2.5 points, with the record path's backlog larger (``benchmarks/live/README.md`` § "The record
path's priority").

Raising one's own nice value needs no privilege (lowering it does), so the trainer lowers *its own*
priority and not its executors' raised: it starts the executors' forkserver first
(:func:`~ferret_core.engine.processes.executor.start_executor_parent`), whose children keep the priority
it was started with, then raises the nice value of every thread of its process by the increment. Linux
keeps a nice value per thread and a new thread takes its creator's, so threads started later (a
re-plan's router, the Kafka client's) run at the same priority. The record path still has the cores the
executors leave: one executor thread per core it was planned for never takes the record path's core, so
the nice value only decides who runs when both want the same core; predictions stay as prompt where the
machine has room (half saturation); past saturation, where the record path cannot keep up either way, its
backlog grows faster (the benchmark's p50 at 1,000 items/s: 0.95 s against 0.58 s). Where
``/proc/self/task`` does not exist (not Linux) only the calling thread's value is set, which on other POSIX
systems is the whole process's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

NICE_MAX = 19  # the lowest priority a nice value gives (setpriority(2) clamps higher values to it)


@dataclass(frozen=True)
class RecordPathPriority:
    """What :func:`lower_record_path_priority` did: the nice value before and after, and how many threads
    it was set on (``per_thread`` False: the process's value was set through the calling thread)."""

    nice_before: int
    nice_after: int
    threads: int
    per_thread: bool

    def describe(self) -> str:
        if self.nice_after == self.nice_before:
            return f"record path at nice {self.nice_after}, the same as its executor processes (nothing to lower)"
        where = f"{self.threads} threads" if self.per_thread else "the process"
        return (
            f"record path at nice {self.nice_after} ({where}), its executor processes at {self.nice_before}: "
            "training runs first where both want a core"
        )


def thread_ids(task_dir: Path = Path("/proc/self/task")) -> list[int] | None:
    """This process's thread ids (Linux ``/proc``); None where the kernel does not list them."""
    try:
        return sorted(int(entry.name) for entry in task_dir.iterdir() if entry.name.isdigit())
    except OSError:
        return None


def lower_record_path_priority(increment: int) -> RecordPathPriority:
    """Raise the nice value of every thread of this process by ``increment`` (≥ 0; capped at
    :data:`NICE_MAX`). Call it after the executors' forkserver runs (module docstring). A thread that
    ends while it is being set is skipped."""
    if increment < 0:
        raise ValueError(f"a nice increment lowers priority and must be >= 0, got {increment}")
    before = os.getpriority(os.PRIO_PROCESS, 0)  # the calling thread's
    after = min(NICE_MAX, before + increment)
    tids = thread_ids()
    if tids is None:
        os.setpriority(os.PRIO_PROCESS, 0, after)
        return RecordPathPriority(before, after, 1, per_thread=False)
    done = 0
    for tid in tids:
        try:
            current = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, max(current, after))  # never raises a thread's priority
            done += 1
        except ProcessLookupError:  # the thread ended meanwhile
            continue
    return RecordPathPriority(before, after, done, per_thread=True)
