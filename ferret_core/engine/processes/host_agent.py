"""A host of a process clock over several hosts: the owning rank's side (:mod:`.hosts` is the coordinator's).

:func:`serve_host` runs on every rank of the job but the coordinator's. For each clock the coordinator
starts, it receives the stages this rank owns (their initial tensors, version-slot counts, delta-ring
capacities and whether they keep an average step), holds their version slots, delta rings and average
steps in this host's shared memory, starts the
executors of those stages as child processes (the forkserver the one-host clock uses) when asked, and
relays: the coordinator's messages down each executor's pipe, each executor's answers and its exit back
up the job's group (:class:`~ferret_core.engine.processes.link.Link`). After every update of an owned
stage a follower thread sends the newest master to the coordinator (coalesced: the newest version each
time the previous send completed), which predicts with that copy.

A lost coordinator (its link fails) ends the executors here and the agent; an executor that dies is
reported with its exit code after its last words; the agent's own failure is reported as ``failed``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing.connection as mpc
import os
import threading
import time
import traceback
from collections.abc import Mapping
from typing import Any

import torch.multiprocessing as tmp

from ferret_core.compensation import StageCompensator
from ferret_core.engine.processes.average import SharedStepAverage
from ferret_core.engine.processes.deltas import SharedDeltas
from ferret_core.engine.processes.dispatch import Executor
from ferret_core.engine.processes.executor import (
    PRELOAD,
    START_METHOD,
    ExecutorSpec,
    start_executor,
    stop_executors,
)
from ferret_core.engine.processes.follow import (
    BYE,
    END_OF_SESSION,
    FOLLOW_SHARE,
    check_follow_share,
    pause_after_send,
    send_marker,
    send_master,
)
from ferret_core.engine.processes.hosts import HEARTBEAT_S, LOST_AFTER_S
from ferret_core.engine.processes.link import TAG_DOWN, TAG_UP, Link
from ferret_core.engine.processes.pool import JOIN_TIMEOUT_S
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.engine.processes.stage_state import CompensatorSpec, load_state, read_state, stage_view
from ferret_core.engine.processes.tuning import StageTunings
from ferret_core.errors import ConfigError, ExecutorLost, ScheduleError


class _Session:
    """One clock's stages, executors and follower thread on this host."""

    def __init__(
        self,
        link: Link,
        ctx: Any,
        owned: dict[int, tuple[Any, int, int, bool]],
        group: Any,
        follow_share: float = FOLLOW_SHARE,
    ) -> None:
        self.link = link
        self.follow_share = check_follow_share(follow_share)
        self.ctx = ctx
        self.group = group
        self.stages: dict[int, SharedStageVersions] = {}
        self.deltas: dict[int, SharedDeltas | None] = {}
        self.averages: dict[int, SharedStepAverage | None] = {}
        self.tunings = StageTunings()  # built at a stage's first executor that keeps one
        self._initial = {j: initial for j, (initial, *_) in owned.items()}
        for j, (initial, slots, ring, averaged) in owned.items():
            self.stages[j] = SharedStageVersions(initial, slots, ctx.Lock(), ctx.Lock())
            self.deltas[j] = SharedDeltas(j, initial.params, ring) if ring > 0 else None
            self.averages[j] = SharedStepAverage(j, initial.params) if averaged else None
        self.conns: dict[Executor, mpc.Connection] = {}
        self.processes: dict[Executor, Any] = {}
        self._updated = threading.Event()
        self._stopping = threading.Event()
        self._sent = {j: stage.current_version() for j, stage in self.stages.items()}
        self._follower = threading.Thread(target=self._follow, name="ferret-follower", daemon=True)
        self._follower.start()

    def shared_bytes(self) -> int:
        rings = sum(d.nbytes() for d in self.deltas.values() if d is not None)
        rings += sum(a.nbytes() for a in self.averages.values() if a is not None)
        rings += self.tunings.nbytes()
        return sum(s.nbytes() for s in self.stages.values()) + rings

    def spawn(self, spec: ExecutorSpec) -> None:
        executor = (spec.worker, spec.stage)
        stage = self.stages.get(spec.stage)
        if stage is None:
            raise ScheduleError(f"stage {spec.stage} is not owned by this host (it owns {sorted(self.stages)})")
        spec = dataclasses.replace(spec, replica=stage.pin_current())
        j = spec.stage
        params = self._initial[j].params
        tuning = self.tunings.get(j, params, spec.compensator, spec.compensator_settings, spec.ring_capacity)
        parent, process = start_executor(self.ctx, spec, stage, self.deltas[j], self.averages[j], tuning)
        self.conns[executor] = parent
        self.processes[executor] = process
        self.link.send(("spawned", executor, process.pid))

    def relay_up(self, executor: Executor, answer: Any) -> None:
        self.link.send(("reply", executor, answer))
        kind = answer[0] if isinstance(answer, tuple) and answer else None
        backward = answer[2] if kind == "FB" else answer if kind == "B" else None
        if backward is not None and backward[6] is not None:
            self._updated.set()

    def exited(self, executor: Executor) -> None:
        conn = self.conns.pop(executor)
        while True:  # its last words first (an error it sent before exiting)
            try:
                if not conn.poll():
                    break
                self.relay_up(executor, conn.recv())
            except (EOFError, OSError):
                break
        conn.close()
        process = self.processes.pop(executor)
        process.join(JOIN_TIMEOUT_S)
        self.link.send(("exited", executor, process.exitcode))

    def sync(self) -> None:
        self._updated.set()  # the newest masters, at most the follow share's wait from now
        self.link.send(("synced", {j: stage.current_version() for j, stage in self.stages.items()}))

    def compensator_states(
        self, specs: Mapping[int, CompensatorSpec], timeout: float
    ) -> tuple[dict[int, dict[str, Any]], str | None]:
        """The owned stages' compensator states (:mod:`.stage_state`), or the reason they cannot be read."""
        try:
            return {j: read_state(self._view(j, spec), self.stages[j].update_lock, j, timeout)
                    for j, spec in specs.items()}, None  # fmt: skip
        except (ScheduleError, ConfigError, KeyError, ValueError, RuntimeError) as exc:
            return {}, f"{type(exc).__name__}: {exc}"

    def load_compensator_states(
        self, loads: Mapping[int, tuple[CompensatorSpec, Mapping[str, Any]]], timeout: float
    ) -> str | None:
        """Write the owned stages' compensator states; None, or the reason it failed."""
        try:
            for j, (spec, state) in loads.items():
                load_state(self._view(j, spec, ring=False), self.stages[j].update_lock, j, state, timeout)
        except (ScheduleError, ConfigError, KeyError, ValueError, RuntimeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _view(self, stage: int, spec: CompensatorSpec, *, ring: bool = True) -> StageCompensator:
        if stage not in self.stages:
            raise ConfigError(f"stage {stage} is not owned by this host (it owns {sorted(self.stages)})")
        params = self._initial[stage].params
        tuning = self.tunings.get(stage, params, spec.compensator, spec.settings, spec.ring_capacity)
        return stage_view(spec, params, deltas=self.deltas[stage], average=self.averages[stage], tuning=tuning,
                          ring=ring)  # fmt: skip

    def close(self) -> None:
        for conn in self.conns.values():
            with contextlib.suppress(OSError, EOFError):
                conn.send(None)
        stop_executors(self.processes.values(), self.conns.values(), JOIN_TIMEOUT_S)
        self._stopping.set()
        self._updated.set()
        self._follower.join(JOIN_TIMEOUT_S)  # its last send is END_OF_SESSION, which the coordinator waits for

    def _follow(self) -> None:
        """Send the newest master of every owned stage that moved, after updates (coalesced), spending at
        most the follow share of this thread's time sending (:mod:`.follow`); then end the clock's masters."""
        try:
            while True:
                self._updated.wait()
                if self._stopping.is_set():
                    break
                self._updated.clear()
                t0 = time.perf_counter()
                for j, stage in self.stages.items():
                    if stage.current_version() > self._sent[j]:
                        self._sent[j] = send_master(stage, self.link.peer, self.group)
                spent = time.perf_counter() - t0
                if self._stopping.wait(pause_after_send(spent, self.follow_share)):
                    break
            send_marker(END_OF_SESSION, self.link.peer, self.group)
        except Exception:
            return  # the coordinator is gone: the control link reports it


def serve_host(*, coordinator: int = 0, group: Any = None, start_method: str = START_METHOD) -> None:
    """Serve the coordinator's clocks on this rank until it says ``exit`` or is lost (see the module
    docstring). ``torch.distributed`` must be initialised (under ``torchrun``: ``init_process_group('gloo')``)."""
    ctx: Any = tmp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    link = Link(coordinator, send_tag=TAG_UP, recv_tag=TAG_DOWN, group=group, name="coordinator")
    inbox_r, inbox_w = mpc.Pipe(duplex=False)

    def receive() -> None:
        while True:
            try:
                message = link.recv()
            except BaseException as exc:
                inbox_w.send(("lost", f"{type(exc).__name__}: {exc}"))
                return
            inbox_w.send(message)
            if message[0] == "exit":
                return

    threading.Thread(target=receive, name="ferret-host-receive", daemon=True).start()
    session: _Session | None = None
    heard = pinged = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now - pinged >= HEARTBEAT_S:
                link.send(("ping",))
                pinged = now
            if now - heard > LOST_AFTER_S:
                raise ExecutorLost(f"the coordinator (rank {coordinator}) has been silent for {now - heard:.1f} s")
            conns = {} if session is None else {c: e for e, c in session.conns.items()}
            sentinels = {} if session is None else {p.sentinel: e for e, p in session.processes.items()}
            for ready in mpc.wait([inbox_r, *conns, *sentinels], timeout=HEARTBEAT_S):
                if ready in sentinels:
                    assert session is not None
                    if sentinels[ready] in session.processes:
                        session.exited(sentinels[ready])
                    break
                if ready in conns:
                    assert session is not None
                    executor = conns[ready]
                    try:
                        answer = ready.recv()
                    except (EOFError, OSError):
                        continue  # its sentinel reports the exit
                    session.relay_up(executor, answer)
                    continue
                message = inbox_r.recv()
                heard = time.monotonic()
                kind = message[0]
                if kind == "ping":
                    continue
                if kind == "to":
                    _, executor, payload = message
                    if session is not None and executor in session.conns:
                        with contextlib.suppress(OSError, EOFError):
                            session.conns[executor].send(payload)
                elif kind == "spawn":
                    if session is None:
                        raise ScheduleError("spawn before setup")
                    session.spawn(message[1])
                    break  # wait on the new executor too
                elif kind == "kill":
                    if session is not None and message[1] in session.processes:
                        session.processes[message[1]].kill()
                elif kind == "clock":
                    link.send(("clock", time.perf_counter()))
                elif kind == "setup":
                    if session is not None:
                        session.close()
                    session = _Session(link, ctx, message[1], group, *message[2:3])  # [2]: the follow share
                    link.send(("ready", session.shared_bytes(), os.getpid(), session.follow_share))
                    break
                elif kind == "sync":
                    if session is not None:
                        session.sync()
                    else:
                        link.send(("synced", {}))
                elif kind == "compensator-states":
                    states, error = ({}, "no clock on this host") if session is None else session.compensator_states(
                        *message[1:3]
                    )
                    link.send(("compensator-states", states, error))
                elif kind == "load-compensator-states":
                    error = "no clock on this host" if session is None else session.load_compensator_states(
                        *message[1:3]
                    )
                    link.send(("compensator-states-loaded", None, error))
                elif kind == "teardown":
                    if session is not None:
                        session.close()
                        session = None
                    link.send(("torn-down",))
                    break
                elif kind == "lost":
                    raise ExecutorLost(f"the link to the coordinator (rank {coordinator}) failed: {message[1]}")
                elif kind == "exit":
                    if session is not None:
                        session.close()
                        session = None
                    link.send(("bye",))
                    with contextlib.suppress(Exception):
                        send_marker(BYE, coordinator, group)
                    return
                else:
                    raise ScheduleError(f"host got an unknown message {kind!r}")
    except BaseException as exc:
        with contextlib.suppress(Exception):
            link.send(("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
        if session is not None:
            session.close()
        raise
    finally:
        link.close()
