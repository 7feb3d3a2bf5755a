"""The body of one executor process: worker n's stage, over the stage's versions in shared memory.

The coordinator (:class:`~ferret_core.engine.processes.clock.ProcessClock`) runs the scheduler and sends
each item the scheduler starts on this executor over a pipe; the process runs it and answers with what
the trace needs (the versions read and written, the times). With one stage, an item's B is the
executor's next action once its F is done (1F1B: a ready B goes first), so one message carries both.
What an action does is the thread engine's (:mod:`ferret_core.engine.pipeline`), on shared slots
instead of Python-owned versions (:mod:`ferret_core.engine.processes.slots`):

* **F** pins the worker's replica for the item (weight stashing) and runs the stage forward, keeping
  the graph, or under T1 only the input;
* **B** (under T1 after recomputing the graph on the stash) back-propagates the item's loss, compensates
  the gradient to the current master (under the stage's update lock), adds it to the worker's buffer (T2)
  and releases the stash; once the buffer holds c^a gradients, the **U** writes the optimizer's step into
  a free slot, publishes it as the next master version and moves the worker's replica to it.

A non-finite gradient (or compensated gradient) is dropped, never applied, and reported. An exception
is sent to the coordinator with its traceback and ends the process; so does a closed pipe (the
coordinator is gone): an executor never outlives the process that drives it.
"""

from __future__ import annotations

import contextlib
import resource
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.engine.pipeline import all_finite
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.engine.stage_exec import StageGraph, StageProgram, backward, forward_no_grad, forward_with_grad
from ferret_core.engine.state import GradientBuffer
from ferret_core.errors import ScheduleError


@dataclass(frozen=True)
class ExecutorSpec:
    """What executor (``worker``, stage 0) runs: its stage's program, the (slot, version) the coordinator
    pinned as its first replica, the worker's T1/T2 settings, the master's SGD learning rate, the
    compensator (by registry name), the torch threads it may use and whether it flushes denormal floats
    to zero (``torch.set_flush_denormal``; a process does not inherit its coordinator's choice)."""

    worker: int
    program: StageProgram
    replica: tuple[int, int]
    accumulation: int
    recompute: bool
    lr: float
    compensator: str
    compensator_settings: CompensatorSettings = field(default_factory=CompensatorSettings)
    ring_capacity: int = 0
    threads: int = 1
    flush_denormal: bool = False


@dataclass
class _Item:
    stash: tuple[int, int]  # (slot, version) pinned from F to B
    target: Tensor
    graph: StageGraph | None = None
    x: Tensor | None = None  # kept for the recompute (T1)


class _Executor:
    def __init__(self, spec: ExecutorSpec, stage: SharedStageVersions) -> None:
        self.spec = spec
        self.stage = stage
        self.runner = spec.program.runner()
        initial = stage.params[0]
        self.compensator = make_compensator(
            spec.compensator, initial, spec.compensator_settings, spec.ring_capacity
        )
        self.buffer = GradientBuffer()
        self.replica = spec.replica
        self.items: dict[int, _Item] = {}

    def forward(self, index: int, x: np.ndarray[Any, Any], target: int) -> tuple[Any, ...]:
        t0 = time.perf_counter()
        slot, version = self.replica
        self.stage.pin(slot)
        item = _Item((slot, version), torch.tensor([target]))
        self.items[index] = item
        view = self.stage.view(slot, version)
        inputs = torch.from_numpy(x).unsqueeze(0)
        if self.spec.recompute:
            forward_no_grad(self.runner, view, inputs)
            item.x = inputs
        else:
            item.graph = forward_with_grad(self.runner, view, inputs, input_grad=False)
        return ("F", index, version, t0, time.perf_counter())

    def backward(self, index: int) -> tuple[Any, ...]:
        item = self.items.pop(index)
        t0 = time.perf_counter()
        slot, version = item.stash
        view = self.stage.view(slot, version)
        t_recompute = None
        if self.spec.recompute:
            if item.x is None:
                raise ScheduleError(f"item {index}: the input kept for recomputation is gone")
            item.graph = forward_with_grad(self.runner, view, item.x, input_grad=False)
            t_recompute = time.perf_counter()
        if item.graph is None:
            raise ScheduleError(f"item {index}: B without its forward graph")
        grads, _ = backward(item.graph, target=item.target)
        item.graph = None
        finite = all_finite(grads)
        stage = self.stage
        with stage.update_lock:
            if finite:
                now_slot, now_version = stage.current()
                fixed = self.compensator.compensate(
                    list(grads),
                    staleness=now_version - version,
                    theta_then=view.params,
                    theta_now=stage.params[now_slot],
                )
                unchanged = all(f is g for f, g in zip(fixed, grads, strict=True))
                finite = unchanged or all_finite(fixed)
                if finite:
                    self.buffer.add(fixed, version)
            stage.unpin(slot)
        t_end = time.perf_counter()
        update = self._update() if self.buffer.count >= self.spec.accumulation else None
        return ("B", index, version, t0, t_recompute, t_end, update, not finite)

    def _update(self) -> tuple[int, int, float, float, list[int]]:
        """T2's update point: plain SGD (DESIGN §3.11), θ − lr·g from the buffer's sum, as the next master
        version: in place where only this worker's replica reads the master, else written once into a
        free slot and published; the worker's replica moves to it."""
        stage = self.stage
        lr = self.spec.lr
        with stage.update_lock:
            t0 = time.perf_counter()
            grads, reads = self.buffer.take()
            now_slot, now_version = stage.current()
            written = now_version + 1

            def in_place() -> None:
                with torch.no_grad():
                    for param, grad in zip(stage.params[now_slot], grads, strict=True):
                        param.sub_(grad, alpha=lr)

            own = int(self.replica[0] == now_slot)
            if own and stage.write_in_place(now_slot, own, in_place, written):
                self.replica = (now_slot, written)
            else:
                out = stage.free_slot()
                with torch.no_grad():
                    for new, old, grad in zip(stage.params[out], stage.params[now_slot], grads, strict=True):
                        torch.sub(old, grad, alpha=lr, out=new)
                stage.publish(out, written, replica=self.replica[0])
                self.replica = (out, written)
            t_end = time.perf_counter()
        return (now_version, written, t0, t_end, [now_version - r for r in reads])


def executor_main(conn: Connection, spec: ExecutorSpec, stage: SharedStageVersions) -> None:
    """Serve actions from ``conn`` until it sends ``None`` or closes; report a failure and stop."""
    torch.set_num_threads(spec.threads)
    torch.set_flush_denormal(spec.flush_denormal)
    executor: _Executor | None = None
    item: int | None = None
    try:
        executor = _Executor(spec, stage)
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return  # the coordinator is gone
            if message is None:
                return
            kind, *args = message
            item = args[0] if args else None
            if kind == "FB":  # one stage: the scheduler's next action after an item's F is its B
                forward = executor.forward(*args)
                conn.send(("FB", forward, executor.backward(args[0])))
            elif kind == "stats":
                usage = resource.getrusage(resource.RUSAGE_SELF)
                conn.send(("stats", time.process_time(), usage.ru_maxrss * 1024))
            else:
                raise ScheduleError(f"executor {spec.worker}/0 got an unknown message {kind!r}")
    except BaseException as exc:  # reported to the coordinator, which raises it in its caller
        with contextlib.suppress(OSError, EOFError):
            conn.send(("error", item, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
