"""The body of one executor process: worker n's stage j, over the stage's versions in shared memory.

The coordinator (:class:`~ferret_core.engine.processes.clock.ProcessClock`) runs the scheduler and sends
each action the scheduler starts on this executor over a pipe; the process runs it and answers with what
the trace needs (the versions read and written, the times). At the last stage an item's B is the
executor's next action once its F is done (1F1B: a ready B goes first), so one message carries both.
Between the stages of a worker, activations (forward) and their gradients (backward) travel over
``torch.distributed`` (gloo point-to-point, tagged with the item), never through the coordinator.
What an action does is the thread engine's (:mod:`ferret_core.engine.pipeline`), on shared slots instead
of Python-owned versions (:mod:`ferret_core.engine.processes.slots`):

* **F** receives the stage input (stage 0: from the coordinator's message), pins the worker's replica for
  the item where the item is back-propagated (weight stashing; T3 omits the rest), runs the stage forward
  keeping the graph (under T1 only the input) and sends the output to the next stage;
* **B** (under T1 after recomputing the graph on the stash) back-propagates the item's loss (last stage)
  or the gradient received from the next stage, sends the input's gradient to the stage before (above
  the item's lowest back-propagated stage), compensates the parameter gradient to the current master
  (under the stage's update lock), adds it to the worker's buffer (T2) and releases the stash; once the
  buffer holds c^a gradients, the **U** writes the step and publishes it as the next master version
  (where the compensator walks the master's deltas, after pushing θ_new − θ_old to the stage's shared
  delta ring, :mod:`ferret_core.engine.processes.deltas`, which every executor of the stage compensates
  from; for Gap-Aware, after folding it into the stage's shared average step C and count n,
  :mod:`ferret_core.engine.processes.average`, which every executor of the stage reads).

**Memory.** Each executor measures what it holds in its own process with the engine's meter
(:mod:`ferret_core.engine.memory_meter`), sampled after each F, R and B as the thread engine's (an update
only empties the gradient buffer the B's sample counted, so it is not sampled): the
stage inputs, outputs and labels of its items in flight, autograd's saved tensors of their graphs, the
tensors its sends to the next or previous stage still hold, its gradient buffer (T2) and its
compensator's statistics. The shared version slots, delta rings, average steps and tuning states are
excluded (the coordinator counts them once: :meth:`ProcessClock.measured_bytes`). Its peak rides on every
answer; the sampling's own time is reported with the usage (``stats``).

A non-finite gradient (or compensated gradient) is dropped, never applied, and reported. An exception
is sent to the coordinator with its traceback and ends the process; so does a closed pipe (the
coordinator is gone): an executor never outlives the process that drives it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import io
import multiprocessing.forkserver as forkserver
import resource
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as tmp
from torch import Tensor

from ferret_core.compensation import CompensatorSettings, make_compensator
from ferret_core.compensation.simple import GapAwareCompensator
from ferret_core.engine.heap import retain_freed_memory
from ferret_core.engine.memory_meter import MemoryMeter, StorageKey, storage_key, storage_keys
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.engine.processes.tuning import SharedTuning
from ferret_core.engine.stage_exec import StageGraph, StageProgram, backward, forward_no_grad, forward_with_grad
from ferret_core.engine.stage_update import all_finite
from ferret_core.engine.state import GradientBuffer
from ferret_core.engine.step_guard import bounded, finite_norm
from ferret_core.errors import ScheduleError

START_METHOD = "forkserver"  # executors start from a forkserver that has imported these (PRELOAD)
PRELOAD = ["torch", "ferret_core.engine.processes.executor"]


@dataclass(frozen=True)
class ExecutorSpec:
    """What executor (``worker``, ``stage``) runs: its stage's program, the (slot, version) the
    coordinator pinned as its first replica, the worker's T1/T2 settings at this stage, the master's SGD
    learning rate, the compensator (by registry name), the torch threads it may use and whether it
    flushes denormal floats to zero (``torch.set_flush_denormal``; a process does not inherit its
    coordinator's choice) and keeps freed memory in its heap (``retain_heap``, :mod:`ferret_core.engine.heap`).
    With several stages, ``rank`` of ``world_size`` in the executors' gloo
    process group (rendezvous through the file ``store`` on one host, or the TCP store at
    ``store_address`` the coordinator hosts over several, :mod:`.hosts`) and the ranks of the worker's executors of the
    stages before and after (``None`` at the ends)."""

    worker: int
    stage: int
    num_stages: int
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
    retain_heap: bool = False
    rank: int = 0
    world_size: int = 1
    store: str | None = None
    store_address: tuple[str, int, str] | None = None  # (host, port, prefix) of a TCP store: several hosts
    prev_rank: int | None = None
    next_rank: int | None = None
    max_step_ratio: float | None = None  # the norm guard (ferret_core.engine.step_guard)
    record_compensations: int = 0  # keep the first this-many stale compensations (ProcessSettings)
    measure_memory: bool = True  # sample what the executor holds after each action (module docstring)
    received: tuple[int, int] = (0, 0)  # Dispatch.received when it started: its sends counted from there


@dataclass
class _Item:
    lowest: int  # the lowest back-propagated stage (T3)
    target: Tensor | None  # the label, at the last stage
    stash: tuple[int, int] | None = None  # (slot, version) pinned from F to B where the item is back-propagated
    graph: StageGraph | None = None
    x: Tensor | None = None  # the stage input kept for the recompute (T1)

    def tensors(self) -> Iterator[Tensor]:
        """What the item holds here besides its graph's saved tensors (its stash is a shared slot's pin)."""
        graph = self.graph
        held = (self.target, self.x, None if graph is None else graph.input, None if graph is None else graph.output)
        return (t for t in held if t is not None)


def _tag(item: int) -> int:
    return item % (2**31 - 1)


class _Executor:
    def __init__(
        self,
        spec: ExecutorSpec,
        stage: SharedStageVersions,
        deltas: SharedDeltas | None,
        average: SharedStepAverage | None = None,
        tuning: SharedTuning | None = None,
    ) -> None:
        self.spec = spec
        self.stage = stage
        self.runner = spec.program.runner()
        self.compensator = make_compensator(
            spec.compensator, stage.params[0], spec.compensator_settings, spec.ring_capacity
        )
        self.deltas = deltas  # the stage's shared delta ring (Alg. 1's compensators), else None
        if deltas is not None:
            self.compensator.share_ring(deltas.ring())
        self.average = average  # the stage's shared average step (Gap-Aware's C and n), else None
        if average is not None:
            self.compensator.share_average(average.tensors(), average.count)
        if tuning is not None:  # the stage's λ, EMAs or mean square, which every executor of the stage learns
            self.compensator.share_tuning_state(tuning.tensors())
        self.records: list[dict[str, Any]] = []  # spec.record_compensations' stale compensations
        self.compensate_seconds = 0.0  # wall seconds in the compensator's calls (reported, not used)
        self.push_seconds = 0.0  # wall seconds writing deltas to the shared ring or folding them into the average
        self.buffer = GradientBuffer()
        self.replica = spec.replica
        self.items: dict[int, _Item] = {}
        # isend works not known to be received and the tensors they read, forward (item, work, payload) and
        # backward (work, payload), oldest first (:meth:`_send`)
        self._forward_sends: collections.deque[tuple[int, Any, Tensor]] = collections.deque()
        self._backward_sends: collections.deque[tuple[Any, Tensor]] = collections.deque()
        self._forward_sent, self._backward_sent = spec.received  # sends so far, as the neighbours count them
        self.actions = 0  # F and B actions run (a B's R and U included)
        self.sample_seconds = 0.0  # CPU seconds in the memory meter's samples (reported, not used)
        self.meter: MemoryMeter | None = None
        if spec.measure_memory:
            shared = [
                *stage.storages(),
                *(deltas.storages() if deltas is not None else ()),
                *(average.storages() if average is not None else ()),
                *(tuning.storages() if tuning is not None else ()),
            ]
            self.meter = MemoryMeter(
                {"items": self._item_storages, "sends": self._send_storages, "gradients": self._buffer_storages},
                exclude=shared,
                cuda=False,
            )
            self.meter.add_source("compensator", self.compensator.state_storages, stable=True)
        self._generation = self.compensator.state_generation
        self._sample()  # what an idle executor holds (its compensator's state)

    # ----------------------------------------------------------------- messages between stage ranks
    def _send(self, tensor: Tensor, dst: int | None, item: int, *, forward: bool) -> None:
        """Send ``tensor`` to stage rank ``dst`` without waiting, keeping it until the send is known to be
        received. A gloo send never reports completion by itself (``is_completed()`` stays false until
        ``wait()``), so the payloads are let go once the schedule proves them read, where ``wait()``
        returns at once: a forward send once this stage runs a B of that item or a later one (the next
        stage ran their F's, in the worker's item order, before any gradient came back) or the coordinator
        says the next stage finished its F, a backward send once it says the stage before finished the
        item's B (:meth:`acknowledge`). Keeping every payload until :meth:`finish_sends` held one
        activation or gradient per item ever sent (measured)."""
        if dst is None:
            raise ScheduleError(f"executor {self.spec.worker}/{self.spec.stage}: no stage after it for item {item}")
        payload = tensor.detach().contiguous()
        work = dist.isend(payload, dst, tag=_tag(item))
        if forward:
            self._forward_sends.append((item, work, payload))
            self._forward_sent += 1
        else:
            self._backward_sends.append((work, payload))
            self._backward_sent += 1

    def acknowledge(self, forwards_next: int, backwards_prev: int) -> None:
        """The next stage has finished ``forwards_next`` F's of this worker and the previous one
        ``backwards_prev`` B's (:meth:`Dispatch.received`): each read one of this executor's sends, in the
        order they were sent; let go of those."""
        forwards = self._forward_sends
        while forwards and self._forward_sent - len(forwards) < forwards_next:
            forwards.popleft()[1].wait()
        backwards = self._backward_sends
        while backwards and self._backward_sent - len(backwards) < backwards_prev:
            backwards.popleft()[0].wait()

    def _received(self, item: int) -> None:
        """The next stage has run ``item``'s F (this stage runs its B): let go of the forward sends up to it."""
        sends = self._forward_sends
        if not any(i == item for i, _, _ in sends):
            return
        while sends:
            sent, work, _ = sends.popleft()
            work.wait()
            if sent == item:
                return

    def _recv(self, src: int | None, shape: Sequence[int], item: int) -> Tensor:
        if src is None:
            raise ScheduleError(f"executor {self.spec.worker}/{self.spec.stage}: no stage before it for item {item}")
        buffer = torch.empty(tuple(shape))
        dist.recv(buffer, src, tag=_tag(item))
        return buffer

    def finish_sends(self) -> None:
        for _, work, _ in self._forward_sends:
            work.wait()
        for work, _ in self._backward_sends:
            work.wait()
        self._forward_sends.clear()
        self._backward_sends.clear()

    # ---------------------------------------------------------------------------------- the actions
    def forward(
        self, index: int, lowest: int, x: np.ndarray[Any, Any] | None, target: int | None, in_shape: Sequence[int]
    ) -> tuple[Any, ...]:
        t0 = time.perf_counter()
        j, last = self.spec.stage, self.spec.num_stages - 1
        if j == 0:
            if x is None:
                raise ScheduleError(f"item {index}: stage 0's F needs the item's input")
            inputs = torch.from_numpy(x).unsqueeze(0)
        else:
            inputs = self._recv(self.spec.prev_rank, in_shape, index)
        slot, version = self.replica
        view = self.stage.view(slot, version)
        if j >= lowest:  # weight stashing: the B reads what this F read
            item = self.items[index] = _Item(lowest, None if target is None else torch.tensor([target]))
            self.stage.pin(slot)
            item.stash = (slot, version)
            if self.spec.recompute:
                out = forward_no_grad(self.runner, view, inputs)
                item.x = inputs
            else:
                with self._saving():
                    item.graph = forward_with_grad(self.runner, view, inputs, input_grad=j > lowest)
                out = item.graph.output.detach()
        else:  # T3: this stage is not back-propagated for the item
            out = forward_no_grad(self.runner, view, inputs)
        if j < last:
            self._send(out, self.spec.next_rank, index, forward=True)
        t_end = time.perf_counter()
        del inputs, out
        self.actions += 1
        self._sample()
        return ("F", index, version, t0, t_end)

    def backward(self, index: int, out_shape: Sequence[int]) -> tuple[Any, ...]:
        item = self.items.pop(index)
        t0 = time.perf_counter()
        j, last = self.spec.stage, self.spec.num_stages - 1
        self._received(index)
        if item.stash is None:
            raise ScheduleError(f"item {index}: B at stage {j} without its stash (its F did not run here)")
        slot, version = item.stash
        view = self.stage.view(slot, version)
        input_grad = j > item.lowest
        t_recompute = None
        if self.spec.recompute:
            if item.x is None:
                raise ScheduleError(f"item {index}: the input kept for recomputation is gone")
            with self._saving():
                item.graph = forward_with_grad(self.runner, view, item.x, input_grad=input_grad)
            item.x = None
            t_recompute = time.perf_counter()
            self._sample()
        if item.graph is None:
            raise ScheduleError(f"item {index}: B without its forward graph")
        if j == last:
            if item.target is None:
                raise ScheduleError(f"item {index}: the last stage's B needs the item's label")
            grads, grad_in = backward(item.graph, target=item.target)
        else:
            grad_out = self._recv(self.spec.next_rank, out_shape, index)
            grads, grad_in = backward(item.graph, grad_output=grad_out)
        item.graph = None
        if input_grad:
            if grad_in is None:
                raise ScheduleError(f"item {index}: stage {j} produced no input gradient for stage {j - 1}")
            self._send(grad_in, self.spec.prev_rank, index, forward=False)
        norm = finite_norm(grads)  # the non-finite check, and the norm guard's gradient norm, in one pass
        finite = norm is not None
        stage = self.stage
        with stage.update_lock:
            if finite:
                now_slot, now_version = stage.current()
                fixed = self._compensate(list(grads), now_version - version, view.params, stage.params[now_slot])
                unchanged = all(f is g for f, g in zip(fixed, grads, strict=True))
                finite = unchanged or all_finite(fixed)
                if finite:
                    self.buffer.add(fixed, version, norm if unchanged else None)
            stage.unpin(slot)
        t_end = time.perf_counter()
        del grads, grad_in
        self.actions += 1
        self._sample()  # the gradient in the buffer, before its update (as the thread engine's B sample)
        # no sample after the update: in this single-threaded process it only empties the buffer the sample
        # above counted (the new master and the deltas are shared segments), so it can never be a new peak
        update = self._update() if self.buffer.count >= self.spec.accumulation else None
        return ("B", index, version, t0, t_recompute, t_end, update, not finite)

    def _compensate(
        self, grads: list[Tensor], staleness: int, theta_then: Sequence[Tensor], theta_now: Sequence[Tensor]
    ) -> list[Tensor]:
        """The compensator's call (under the stage's update lock: the shared ring is not pushed meanwhile),
        recorded with its inputs and state while ``spec.record_compensations`` asks for more."""
        record = staleness > 0 and len(self.records) < self.spec.record_compensations
        before = self.compensator.state_dict() if record else None
        t0 = time.perf_counter()
        fixed = self.compensator.compensate(grads, staleness=staleness, theta_then=theta_then, theta_now=theta_now)
        self.compensate_seconds += time.perf_counter() - t0
        if self.compensator.state_generation != self._generation:  # it allocated state: count it again
            self._generation = self.compensator.state_generation
            if self.meter is not None:
                self.meter.invalidate()
        if before is not None:
            self.records.append(
                {
                    "staleness": staleness,
                    "grads": [g.clone() for g in grads],
                    "theta_then": [t.clone() for t in theta_then],
                    "theta_now": [t.clone() for t in theta_now],
                    "state": before,
                    "out": [f.clone() for f in fixed],
                }
            )
        return fixed

    # ------------------------------------------------------------------------------------------ memory
    def _saving(self) -> contextlib.AbstractContextManager[None]:
        """Track the tensors autograd saves for a graph kept past its action."""
        return self.meter.tracker.hooks() if self.meter is not None else contextlib.nullcontext()

    def _sample(self) -> None:
        """Sample what this executor holds (the meter's peak)."""
        if self.meter is None:
            return
        t0 = time.thread_time()  # CPU time: other processes sharing the cores do not inflate it
        self.meter.sample()
        self.sample_seconds += time.thread_time() - t0

    @property
    def peak_bytes(self) -> int:
        """The most bytes this executor held at a sample, the shared segments excluded (0 when not measured)."""
        return 0 if self.meter is None else self.meter.peak_bytes

    def memory_report(self) -> dict[str, Any]:
        """The meter's peak, its breakdown by source, its samples and their CPU seconds, and the actions run."""
        meter = self.meter
        return {
            "peak_bytes": self.peak_bytes,
            "peak_breakdown": {} if meter is None else dict(meter.peak_breakdown),
            "samples": 0 if meter is None else meter.samples,
            "sample_seconds": self.sample_seconds,
            "actions": self.actions,
        }

    def _item_storages(self) -> Iterator[StorageKey]:
        for item in list(self.items.values()):
            yield from storage_keys(item.tensors())

    def _send_storages(self) -> Iterator[StorageKey]:
        for _, _, payload in self._forward_sends:
            yield storage_key(payload)
        for _, payload in self._backward_sends:
            yield storage_key(payload)

    def _buffer_storages(self) -> Iterator[StorageKey]:
        return storage_keys(self.buffer.tensors())

    def compensation_report(self) -> tuple[dict[str, float], bytes]:
        """The compensator's stats (with the wall seconds spent in its calls and in delta pushes, and for
        Gap-Aware the updates folded into the C it reads) and the recorded calls, serialised
        (``torch.save``: plain tensors, not shared-memory handles, travel over the pipe)."""
        payload = io.BytesIO()
        torch.save(self.records, payload)
        stats = {
            **self.compensator.stats(),
            "compensate_seconds": self.compensate_seconds,
            "push_seconds": self.push_seconds,
        }
        if isinstance(self.compensator, GapAwareCompensator):  # n of the C it reads (the stage's shared one)
            stats["folded_updates"] = float(self.compensator.folded_updates)
        return stats, payload.getvalue()

    def _update(self) -> tuple[int, int, float, float, list[int]]:
        """T2's update point: plain SGD (DESIGN §3.11), θ − lr·g from the buffer's sum (within the norm
        guard's bound, :mod:`ferret_core.engine.step_guard`), as the next master
        version: in place where only this worker's replica reads the master, else written once into a
        free slot and published; the worker's replica moves to it. Where the compensator walks the
        master's deltas or folds them (Gap-Aware), the update is always written into a free slot (as the
        thread engine's) and θ_new − θ_old is pushed to the stage's shared ring, or folded into its shared
        average step, before the new master is published."""
        stage = self.stage
        lr = self.spec.lr
        with stage.update_lock:
            t0 = time.perf_counter()
            norm = self.buffer.norm  # the one gradient's, measured by its non-finite check (else None)
            grads, reads = self.buffer.take()
            now_slot, now_version = stage.current()
            grads = list(bounded(stage.params[now_slot], grads, lr, self.spec.max_step_ratio, norm))
            written = now_version + 1

            def in_place() -> None:
                with torch.no_grad():
                    for param, grad in zip(stage.params[now_slot], grads, strict=True):
                        param.sub_(grad, alpha=lr)

            own = int(self.replica[0] == now_slot)
            observed = self.deltas is not None or self.average is not None
            if own and not observed and stage.write_in_place(now_slot, own, in_place, written):
                self.replica = (now_slot, written)
            else:
                out = stage.free_slot()
                with torch.no_grad():
                    for new, old, grad in zip(stage.params[out], stage.params[now_slot], grads, strict=True):
                        torch.sub(old, grad, alpha=lr, out=new)
                if self.deltas is not None:
                    t_push = time.perf_counter()
                    self.deltas.ring().push_difference(stage.params[out], stage.params[now_slot])
                    self.push_seconds += time.perf_counter() - t_push
                if self.average is not None:  # the thread engine's fold, into the stage's shared C and n
                    t_push = time.perf_counter()
                    with torch.no_grad():
                        delta = [new - old for new, old in zip(stage.params[out], stage.params[now_slot], strict=True)]
                        self.compensator.observe_update(delta)
                    del delta
                    self.push_seconds += time.perf_counter() - t_push
                stage.publish(out, written, replica=self.replica[0])
                self.replica = (out, written)
            t_end = time.perf_counter()
        return (now_version, written, t0, t_end, [now_version - r for r in reads])


def start_executor_parent() -> None:
    """Start the forkserver executors are forked from (with :data:`PRELOAD` imported) now, from the calling
    thread, unless it already runs. The forkserver, and so every executor it forks later, keeps the
    scheduling priority (nice value) the calling thread has *now*: a caller that then lowers its own
    priority (the trainer's record path, ``trainer.record_path_nice``) leaves its executors' as it was. A
    forkserver that died is started again by the next executor's start, from that thread, with its
    priority."""
    ctx: Any = tmp.get_context(START_METHOD)
    ctx.set_forkserver_preload(PRELOAD)
    forkserver.ensure_running()


def start_executor(
    ctx: Any,
    spec: ExecutorSpec,
    stage: SharedStageVersions,
    deltas: SharedDeltas | None,
    average: SharedStepAverage | None = None,
    tuning: SharedTuning | None = None,
) -> tuple[Connection, Any]:
    """Start ``spec``'s executor as a daemon process of ``ctx`` (the forkserver context) over ``stage``'s
    shared slots (and ``deltas`` or ``average``, and ``tuning``); returns the coordinator's end of its pipe
    and the process."""
    parent, child = ctx.Pipe(duplex=True)
    process = ctx.Process(
        target=executor_main,
        args=(child, spec, stage, deltas, average, tuning),
        name=f"ferret-w{spec.worker}s{spec.stage}",
        daemon=True,
    )
    process.start()
    child.close()
    return parent, process


def stop_executors(processes: Iterable[Any], conns: Iterable[Connection], timeout: float) -> None:
    """Wait up to ``timeout`` seconds in all for ``processes`` to exit, kill those still alive, then close
    their pipes ``conns`` (the one-host clock's pool and a host's agent both end their executors so)."""
    deadline = time.perf_counter() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.perf_counter()))
        if process.is_alive():
            process.kill()
            process.join()
    for conn in conns:
        conn.close()


def executor_main(
    conn: Connection,
    spec: ExecutorSpec,
    stage: SharedStageVersions,
    deltas: SharedDeltas | None = None,
    average: SharedStepAverage | None = None,
    tuning: SharedTuning | None = None,
) -> None:
    """Serve actions from ``conn`` until it sends ``None`` or closes; report a failure and stop.
    ``deltas``: the stage's shared delta ring where the compensator walks the master's deltas;
    ``average``: the stage's shared average step where it folds them (Gap-Aware); ``tuning``: the stage's
    shared tuning state where the compensator learns from gradients (Iter-Fisher's λ, DC-ASGD-a)."""
    torch.set_num_threads(spec.threads)
    torch.set_flush_denormal(spec.flush_denormal)
    heap_retained = retain_freed_memory() if spec.retain_heap else False
    executor: _Executor | None = None
    item: int | None = None
    grouped = spec.world_size > 1
    try:
        if grouped and spec.store_address is not None:  # several hosts: the coordinator's TCP store
            host, port, prefix = spec.store_address
            client = dist.TCPStore(host, port, is_master=False)  # type: ignore[attr-defined]
            store = dist.PrefixStore(prefix, client)  # type: ignore[attr-defined]
            dist.init_process_group("gloo", store=store, rank=spec.rank, world_size=spec.world_size)
        elif grouped:
            dist.init_process_group(
                "gloo", init_method=f"file://{spec.store}", rank=spec.rank, world_size=spec.world_size
            )
        executor = _Executor(spec, stage, deltas, average, tuning)
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return  # the coordinator is gone
            if message is None:
                executor.finish_sends()
                return
            kind, *args = message
            item = args[0] if args else None
            if kind in ("F", "FB", "B"):  # each ends with what the neighbours have read of this one's sends
                *args, received = args
                executor.acknowledge(*received)
            if kind == "F":
                conn.send((*executor.forward(*args), executor.peak_bytes))
            elif kind == "FB":  # the last stage: the scheduler's next action after an item's F is its B
                index, lowest, x, target, in_shape, out_shape = args
                forward = executor.forward(index, lowest, x, target, in_shape)
                conn.send(("FB", forward, executor.backward(index, out_shape), executor.peak_bytes))
            elif kind == "B":
                conn.send((*executor.backward(*args), executor.peak_bytes))
            elif kind == "configure":  # a re-plan kept this executor: the worker's new T1/T2 here
                accumulation, recompute = args
                executor.spec = dataclasses.replace(executor.spec, accumulation=accumulation, recompute=recompute)
                item = None
            elif kind == "retire":  # a re-plan removed the worker: let go of the replica and exit
                executor.finish_sends()
                stage.unpin(executor.replica[0])
                return
            elif kind == "stats":
                usage = resource.getrusage(resource.RUSAGE_SELF)
                report = executor.memory_report()
                conn.send(("stats", time.process_time(), usage.ru_maxrss * 1024, report, heap_retained))
            elif kind == "compensation":
                conn.send(("compensation", *executor.compensation_report()))
            else:
                raise ScheduleError(f"executor {spec.worker}/{spec.stage} got an unknown message {kind!r}")
    except BaseException as exc:  # reported to the coordinator, which raises it in its caller
        with contextlib.suppress(OSError, EOFError):
            conn.send(("error", item, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
    finally:
        if grouped and dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
