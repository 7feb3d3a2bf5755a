"""A process clock over several hosts: the coordinator's side.

On one host a :class:`~ferret_core.engine.processes.clock.ProcessClock` starts every (worker, stage)
executor as a child process, talks to it over a pipe and shares each stage's version slots with it in
shared memory. Shared memory does not cross hosts, so over several hosts **each stage's master is owned
by one rank** of the job (``owners[j]``): its version slots and delta ring (or average step) live in that
host's shared memory and every executor of the stage runs there (a child of the host's agent,
:func:`~ferret_core.engine.processes.host_agent.serve_host`). The job's ranks meet through ``torchrun``'s
c10d rendezvous (``--nnodes``, ``--rdzv-endpoint``); the caller initialises the process group (gloo) and
passes :class:`Hosts` to the clock on the coordinator's rank.

* **Control**: the clock's messages to a remote executor and its answers go over the job's group
  (:class:`~ferret_core.engine.processes.link.Link`); here each remote executor is a
  :class:`RemoteConnection` (its answers arrive on a local pipe, so the router waits on it like on any
  other) and a :class:`RemoteProcess` (its sentinel closes when the host reports the executor's exit or
  the host is lost), so the clock's scheduler, router, failure handling and trace are the one-host ones.
* **Activations and gradients** between a worker's stages go straight from executor to executor over
  ``torch.distributed`` (gloo point-to-point, as on one host), the ranks meeting through a TCP store the
  coordinator hosts (:meth:`Hosts.store_address`) instead of a file.
* **Predictions** never wait for training: the coordinator predicts with a **follower copy** of every
  remote stage's master (:meth:`Hosts.follower`), which the owning host refreshes after its updates
  (zero-copy, rate-limited and coalesced: :mod:`.follow`). Every prediction keeps the version sum it
  used; how far the follower was behind the newest master the coordinator had heard of (updates, and
  milliseconds since the first newer one was announced) is recorded per prediction
  (:meth:`Hosts.freshness`). :meth:`Hosts.sync` brings every follower up to its owner's master (what
  ``master_state`` reads, drained).

Timestamps in the executors' answers come from each host's monotonic clock. The trace's order across
hosts is exact where they share one (several "hosts" on one machine, as the tests run); across machines
the stamps of remote executors are shifted by the clock offset measured when the hosts set up (half a
round trip of error), and :meth:`ProcessClock.validate` may report an order that is the clocks' error.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import multiprocessing.connection as mpc
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np
import torch.distributed as dist

from ferret_core.engine.processes.dispatch import Executor
from ferret_core.engine.processes.executor import ExecutorSpec
from ferret_core.engine.processes.follow import (
    BYE,
    END_OF_SESSION,
    FOLLOW_SHARE,
    check_follow_share,
    recv_header,
    recv_master,
)
from ferret_core.engine.processes.link import TAG_DOWN, TAG_UP, Link
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.engine.processes.stage_state import CompensatorSpec
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError, ExecutorLost, ScheduleError
from ferret_core.planning.host_memory import FOLLOWER_SLOTS  # the planner counts what the followers hold

REPLY_TIMEOUT_S = 60.0
HEARTBEAT_S = 1.0  # each side of a link says it is alive this often
LOST_AFTER_S = 10.0  # a peer silent this long is lost (a blocked gloo receive does not notice a dead peer)
CLOCK_PROBES = 7
FRESHNESS_WINDOW = 100_000  # predictions whose freshness is kept (the newest)
HOST_LOCK_WAIT_S = LOST_AFTER_S / 2  # the longest a host's agent waits for a stage's update lock in its loop
_V = TypeVar("_V")


@dataclasses.dataclass(frozen=True)
class Freshness:
    """How far behind the newest master the predicting copies were, over the predictions so far: updates
    (summed over remote stages) and milliseconds since the first update the copy lacked was announced."""

    predictions: int
    updates_p50: float
    updates_p99: float
    updates_max: int
    ms_p50: float
    ms_p99: float
    ms_max: float


class RemoteProcess:
    """A remote executor as the clock's router sees a process: a sentinel that becomes ready when the
    owning host reports the executor's exit (or is lost), its pid there, its exit code."""

    def __init__(self, hosts: Hosts, executor: Executor) -> None:
        self._hosts = hosts
        self.executor = executor
        self.sentinel, self._closer = mpc.Pipe(duplex=False)
        self.pid = -1  # the host's pid for it, once the host says it started
        self.exitcode: int | None = None
        self._gone = threading.Event()

    def is_alive(self) -> bool:
        return not self._gone.is_set()

    def kill(self) -> None:
        self._hosts._send_down(self._hosts.owner(self.executor[1]), ("kill", self.executor), quiet=True)

    def join(self, timeout: float | None = None) -> None:
        self._gone.wait(timeout)

    def exited(self, code: int | None) -> None:
        if not self._gone.is_set():
            self.exitcode = code
            self._gone.set()
            self._closer.close()


class RemoteConnection:
    """A remote executor's pipe as the clock sees it: :meth:`send` goes to the owning host over the
    job's group, answers arrive on a local pipe (:meth:`fileno` for the router's wait)."""

    def __init__(self, hosts: Hosts, executor: Executor) -> None:
        self._hosts = hosts
        self.executor = executor
        self._reader, self._writer = mpc.Pipe(duplex=False)

    def send(self, message: Any) -> None:
        self._hosts._send_down(self._hosts.owner(self.executor[1]), ("to", self.executor, message))

    def deliver(self, message: Any) -> None:
        self._writer.send(message)

    def fileno(self) -> int:
        return self._reader.fileno()

    def poll(self, timeout: float = 0.0) -> bool:
        return self._reader.poll(timeout)

    def recv(self) -> Any:
        return self._reader.recv()

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class Hosts:
    """Which rank owns each stage of a plan, and the coordinator's links to the other ranks (see the
    module docstring). Construct on the coordinator's rank after ``torch.distributed`` is initialised
    (every other rank runs :func:`~ferret_core.engine.processes.host_agent.serve_host`); ``address`` is
    this host's address as the others reach it (where the executors' TCP store listens). One clock at a
    time uses it; :meth:`shutdown` ends the hosts' agents."""

    def __init__(
        self, address: str, *, owners: Sequence[int] = (), group: Any = None, follow_share: float = FOLLOW_SHARE
    ) -> None:
        self.follow_share = check_follow_share(follow_share)  # the hosts' pace of sending masters (:mod:`.follow`)
        if not dist.is_initialized():
            raise ConfigError(
                "Hosts needs torch.distributed initialised (run under torchrun and call "
                "dist.init_process_group('gloo') first)"
            )
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.owners: tuple[int, ...] = ()
        self.place(owners)
        self.address = address
        self.group = group
        self._lock = threading.Condition()
        self._links: dict[int, Link] = {}
        self._followers: dict[int, SharedStageVersions] = {}  # kept until every host ended the clock's masters
        self._masters_done: dict[int, threading.Event] = {}  # per remote rank: its last master of the clock taken
        self._conns: dict[Executor, RemoteConnection] = {}
        self._processes: dict[Executor, RemoteProcess] = {}
        self._replies: dict[tuple[int, str], Any] = {}
        self._shared: dict[int, int] = {}  # per remote rank, the bytes of its stages' shared slots and rings
        self.host_pids: dict[int, int] = {}  # per remote rank, its agent's pid (there)
        self.follow_shares: dict[int, float] = {}  # per remote rank, the follow share it confirmed at setup
        self._offset: dict[int, float] = {}  # per remote rank, its monotonic clock minus ours (0: the same clock)
        self._announced: dict[int, dict[int, float]] = {}  # per remote stage: version → when first announced
        self._newest: dict[int, int] = {}  # per remote stage: the newest master version announced
        self._fresh_updates: collections.deque[int] = collections.deque(maxlen=FRESHNESS_WINDOW)
        self._fresh_ms: collections.deque[float] = collections.deque(maxlen=FRESHNESS_WINDOW)
        self.error: BaseException | None = None
        self._store: Any = None
        self._threads: list[threading.Thread] = []
        others = sorted(set(range(self.world_size)) - {self.rank})
        # set before any receiver starts: a host's first message may arrive at once (it was a race that
        # killed the receiver thread with an AttributeError and the host was then lost after 10 s)
        self._last_heard = {rank: time.monotonic() for rank in others}
        self._closing = threading.Event()
        for rank in others:
            self._masters_done[rank] = threading.Event()
            self._links[rank] = Link(rank, send_tag=TAG_DOWN, recv_tag=TAG_UP, group=group, name=f"host{rank}")
        for rank in others:
            for target, name in ((self._receive, "up"), (self._receive_masters, "masters")):
                thread = threading.Thread(target=target, args=(rank,), name=f"ferret-host{rank}-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)
        beat = threading.Thread(target=self._heartbeat, name="ferret-hosts-heartbeat", daemon=True)
        beat.start()
        for rank in self._links:
            self._offset[rank] = self._measure_offset(rank)

    # ---------------------------------------------------------------------------------------- layout
    def place(self, owners: Sequence[int]) -> Hosts:
        """Own stage j on rank ``owners[j]`` from the next clock on (one clock at a time uses the hosts)."""
        owners = tuple(int(o) for o in owners)
        bad = [o for o in owners if not 0 <= o < self.world_size]
        if bad:
            raise ConfigError(f"stage owners must be ranks 0..{self.world_size - 1} of the job, got {list(owners)}")
        self.owners = owners
        return self

    def owner(self, stage: int) -> int:
        return self.owners[stage]

    def remote(self, stage: int) -> bool:
        return self.owners[stage] != self.rank

    def check(self, num_stages: int) -> None:
        if len(self.owners) != num_stages:
            raise ConfigError(
                f"Hosts names an owner for {len(self.owners)} stage(s), the plan has {num_stages}; give one rank "
                "per stage"
            )

    def store_address(self) -> tuple[str, int]:
        """The TCP store every executor of the clock meets through (hosted here, started on first use)."""
        if self._store is None:
            self._store = dist.TCPStore(  # type: ignore[attr-defined]
                self.address, 0, is_master=True, wait_for_workers=False
            )
        return self.address, int(self._store.port)

    # ---------------------------------------------------------------------------------- a clock's life
    def setup(
        self,
        initial: Sequence[StageVersion],
        slots: Sequence[int],
        ring_sizes: Sequence[int],
        averaged: Sequence[bool],
        lock_factory: Any,
    ) -> dict[int, SharedStageVersions]:
        """Give each remote host its stages (initial tensors, version slots, delta ring capacity, whether
        it keeps a shared average step) and wait until it holds them; returns a follower copy of every
        remote stage (the coordinator predicts with)."""
        with self._lock:
            self._raise_if_failed()
            self._conns.clear()
            self._processes.clear()
            # the freshness window spans clocks: a re-plan's new clock must not hide how fresh the
            # predictions before it were (a service reads it across re-plans)
            self._followers.clear()
            for done in self._masters_done.values():
                done.clear()
            for stage in range(len(initial)):
                if self.remote(stage):
                    self._followers[stage] = SharedStageVersions(
                        initial[stage], FOLLOWER_SLOTS, lock_factory(), lock_factory()
                    )
                    self._newest[stage] = initial[stage].version
                    self._announced[stage] = {}
        for rank in self._links:
            owned = {
                j: (initial[j], slots[j], ring_sizes[j], averaged[j])
                for j in range(len(initial))
                if self.owners[j] == rank
            }
            self._send_down(rank, ("setup", owned, self.follow_share))
        for rank in self._links:
            self._shared[rank], self.host_pids[rank], self.follow_shares[rank] = self._await(rank, "ready")
        return dict(self._followers)

    def spawn(self, spec: ExecutorSpec) -> tuple[RemoteConnection, RemoteProcess]:
        """Start ``spec``'s executor on its stage's host (which pins its first replica at its master)."""
        executor = (spec.worker, spec.stage)
        conn, process = RemoteConnection(self, executor), RemoteProcess(self, executor)
        with self._lock:
            self._conns[executor] = conn
            self._processes[executor] = process
        rank = self.owner(spec.stage)
        self._send_down(rank, ("spawn", spec))
        started, pid = self._await(rank, "spawned")
        if started != executor:
            raise ScheduleError(f"host rank {rank} started executor {started}, asked for {executor}")
        process.pid = pid
        return conn, process

    def sync(self, timeout: float = REPLY_TIMEOUT_S) -> None:
        """Bring every follower up to its owner's current master (call drained, as ``master_state`` does)."""
        for rank in self._links:
            self._send_down(rank, ("sync",))
        deadline = time.perf_counter() + timeout
        for rank in self._links:
            versions: dict[int, int] = self._await(rank, "synced", timeout)
            with self._lock:
                while any(self._followers[j].current_version() < v for j, v in versions.items()):
                    left = deadline - time.perf_counter()
                    self._raise_if_failed()
                    if left <= 0:
                        raise ScheduleError(f"the follower copies did not reach rank {rank}'s masters {versions}")
                    self._lock.wait(left)

    def compensator_states(
        self, stages: Mapping[int, CompensatorSpec], timeout: float = REPLY_TIMEOUT_S
    ) -> dict[int, dict[str, Any]]:
        """The compensator state of each remote stage of ``stages`` (its executors' spec), read by its owner
        under the stage's update lock (:mod:`.stage_state`; drained), waiting for a lock at most ``timeout``
        seconds (capped below the heartbeat's silence rule: the host's agent waits in its loop)."""
        out: dict[int, dict[str, Any]] = {}
        for states in self._ask_owners("compensator-states", "compensator-states", stages, timeout):
            out.update(states)
        return out

    def load_compensator_states(
        self, stages: Mapping[int, tuple[CompensatorSpec, dict[str, Any]]], timeout: float = REPLY_TIMEOUT_S
    ) -> None:
        """Write each remote stage's compensator state (its executors' spec, the state) on its owner, waiting
        for a stage's update lock as :meth:`compensator_states` does."""
        self._ask_owners("load-compensator-states", "compensator-states-loaded", stages, timeout)

    def _ask_owners(self, kind: str, reply: str, stages: Mapping[int, Any], timeout: float) -> list[Any]:
        """Send each owner its stages' part of ``stages`` as ``(kind, part, wait)`` and return the values of
        their answers ``(reply, value, error)``; an error string is raised as :class:`ScheduleError`."""
        wait = min(timeout, HOST_LOCK_WAIT_S)
        asked = self._by_owner(stages)
        for rank, part in asked.items():
            self._send_down(rank, (kind, part, wait))
        values = []
        for rank in asked:
            value, error = self._await(rank, reply, wait + REPLY_TIMEOUT_S)
            if error is not None:
                raise ScheduleError(f"host rank {rank}: {error}")
            values.append(value)
        return values

    def _by_owner(self, stages: Mapping[int, _V]) -> dict[int, dict[int, _V]]:
        out: dict[int, dict[int, _V]] = {}
        for j, value in stages.items():
            if not self.remote(j):
                raise ConfigError(f"stage {j} is owned by this rank, not by another host")
            out.setdefault(self.owner(j), {})[j] = value
        return out

    def teardown(self, timeout: float = REPLY_TIMEOUT_S) -> None:
        """End the clock on every host (its executors stopped, its slots freed); the hosts wait for the next."""
        for rank in self._links:
            self._send_down(rank, ("teardown",), quiet=True)
        for rank in self._links:
            if self.error is None:
                self._await(rank, "torn-down", timeout)
                self._masters_done[rank].wait(timeout)  # no master of this clock is still on its way

    def shutdown(self) -> None:
        """End every host's agent (the job is over)."""
        self._closing.set()
        for rank, link in self._links.items():
            self._send_down(rank, ("exit",), quiet=True)
            link.close()
        for thread in self._threads:  # each ends on the host's goodbye (before the group may be destroyed)
            thread.join(REPLY_TIMEOUT_S)

    def shared_bytes(self) -> int:
        """Bytes of the remote stages' shared slots, delta rings and average steps, on their hosts (the
        followers here are among the clock's ``stages``)."""
        return sum(self._shared.values())

    def shared_bytes_by_rank(self) -> dict[int, int]:
        """:meth:`shared_bytes` per remote rank (as each host reported its stages' segments at setup)."""
        return dict(self._shared)

    # ------------------------------------------------------------------------------------- freshness
    def observe_prediction(self, versions: Sequence[int]) -> None:
        """Record how far the follower versions a prediction used (one per stage) were behind."""
        now = time.perf_counter()
        behind, ms = 0, 0.0
        with self._lock:
            for stage, used in enumerate(versions):
                if not self.remote(stage):
                    continue
                newest = self._newest.get(stage, used)
                if newest > used:
                    behind += newest - used
                    first = self._announced[stage].get(used + 1)
                    if first is not None:
                        ms = max(ms, (now - first) * 1e3)
            self._fresh_updates.append(behind)
            self._fresh_ms.append(ms)

    def freshness(self) -> Freshness:
        """Over the newest FRESHNESS_WINDOW predictions, across this job's clocks (``predictions``: how many)."""
        with self._lock:
            updates = np.asarray(self._fresh_updates or [0])
            ms = np.asarray(self._fresh_ms or [0.0])
            return Freshness(
                len(self._fresh_updates),
                float(np.percentile(updates, 50)),
                float(np.percentile(updates, 99)),
                int(updates.max()),
                float(np.percentile(ms, 50)),
                float(np.percentile(ms, 99)),
                float(ms.max()),
            )

    # ---------------------------------------------------------------------------------------- inside
    def _send_down(self, rank: int, message: Any, *, quiet: bool = False) -> None:
        try:
            self._links[rank].send(message)
        except BrokenPipeError:
            if not quiet:
                raise

    def _await(self, rank: int, kind: str, timeout: float = REPLY_TIMEOUT_S) -> Any:
        deadline = time.perf_counter() + timeout
        with self._lock:
            while (rank, kind) not in self._replies:
                self._raise_if_failed()
                left = deadline - time.perf_counter()
                if left <= 0:
                    raise ScheduleError(f"host rank {rank} did not answer {kind!r} within {timeout} s")
                self._lock.wait(left)
            return self._replies.pop((rank, kind))

    def _measure_offset(self, rank: int) -> float:
        """Rank ``rank``'s monotonic clock minus ours, from the probe with the shortest round trip; 0 where
        the difference is within that round trip (one machine's clock)."""
        best_rtt, offset = math.inf, 0.0
        for _ in range(CLOCK_PROBES):
            t0 = time.perf_counter()
            self._send_down(rank, ("clock",))
            theirs = self._await(rank, "clock")
            t1 = time.perf_counter()
            if t1 - t0 < best_rtt:
                best_rtt, offset = t1 - t0, theirs - (t0 + t1) / 2
        return 0.0 if abs(offset) <= best_rtt else offset

    def _receive(self, rank: int) -> None:
        link = self._links[rank]
        while True:
            try:
                message = link.recv()
            except BaseException as exc:
                self._lose(rank, exc)
                return
            with self._lock:
                self._last_heard[rank] = time.monotonic()
            kind = message[0]
            if kind == "ping":
                continue
            if kind == "reply":
                _, executor, answer = message
                answer = self._shift(answer, self._offset.get(rank, 0.0))
                self._announce(executor[1], answer)
                with self._lock:
                    conn = self._conns.get(executor)
                if conn is not None:
                    conn.deliver(answer)
            elif kind == "exited":
                _, executor, code = message
                with self._lock:
                    process = self._processes.get(executor)
                if process is not None:
                    process.exited(code)
            elif kind == "failed":  # the host's agent itself failed: every executor there is lost
                self._lose(rank, ExecutorLost(f"host rank {rank} failed: {message[1]}"))
                return
            elif kind == "bye":
                return
            else:  # an answer to setup, spawn, clock, sync, teardown
                with self._lock:
                    self._replies[(rank, kind)] = message[1] if len(message) == 2 else message[1:] or None
                    self._lock.notify_all()

    def _receive_masters(self, rank: int) -> None:
        """Take rank ``rank``'s newest masters into the followers (:mod:`.follow`)."""
        while True:
            try:
                stage, version = recv_header(rank, self.group)
                if stage == BYE:
                    return
                if stage == END_OF_SESSION:
                    self._masters_done[rank].set()
                    continue
                recv_master(self._followers[stage], version, rank, self.group)
            except BaseException:
                return  # the control link reports the loss
            with self._lock:
                self._lock.notify_all()

    def _heartbeat(self) -> None:
        """Ping every host each HEARTBEAT_S; a host silent for LOST_AFTER_S is lost (its executors too)."""
        while not self._closing.wait(HEARTBEAT_S):
            now = time.monotonic()
            for rank in self._links:
                self._send_down(rank, ("ping",), quiet=True)
                with self._lock:
                    silent = now - self._last_heard[rank]
                if silent > LOST_AFTER_S and self.error is None:
                    self._lose(rank, TimeoutError(f"no message for {silent:.1f} s"))

    def _announce(self, stage: int, answer: Any) -> None:
        """Note the master version an executor's answer says it wrote (when the coordinator first heard)."""
        kind = answer[0]
        backward = answer[2] if kind == "FB" else answer if kind == "B" else None
        if backward is None or backward[6] is None:
            return
        written = backward[6][1]
        with self._lock:
            if written > self._newest.get(stage, -1):
                self._newest[stage] = written
                announced = self._announced.setdefault(stage, {})
                announced[written] = time.perf_counter()
                follower = self._followers.get(stage)
                if follower is not None and len(announced) > 64:  # forget what the follower already has
                    have = follower.current_version()
                    for version in [v for v in announced if v <= have]:
                        del announced[version]

    @staticmethod
    def _shift(answer: Any, offset: float) -> Any:
        """An executor's answer with its host's stamps moved onto the coordinator's clock."""
        if offset == 0.0 or not isinstance(answer, tuple):
            return answer

        def forward(f: tuple[Any, ...]) -> tuple[Any, ...]:  # ("F", index, version, t0, t_end, ...)
            return (*f[:3], f[3] - offset, f[4] - offset, *f[5:])

        def backward(b: tuple[Any, ...]) -> tuple[Any, ...]:  # ("B", index, version, t0, t_rec, t_end, update, ...)
            update = b[6]
            if update is not None:
                update = (update[0], update[1], update[2] - offset, update[3] - offset, *update[4:])
            t_rec = None if b[4] is None else b[4] - offset
            return (*b[:3], b[3] - offset, t_rec, b[5] - offset, update, *b[7:])

        kind = answer[0]
        if kind == "F":
            return forward(answer)
        if kind == "B":
            return backward(answer)
        if kind == "FB":
            return ("FB", forward(answer[1]), backward(answer[2]), *answer[3:])
        return answer

    def _lose(self, rank: int, exc: BaseException) -> None:
        """Rank ``rank`` is gone: its executors are lost (their sentinels close, the clock fails)."""
        with self._lock:
            if self.error is None:
                self.error = ExecutorLost(f"host rank {rank} is lost: {type(exc).__name__}: {exc}")
            lost = [p for e, p in self._processes.items() if self.owner(e[1]) == rank]
            self._lock.notify_all()
        for process in lost:
            process.exited(None)

    def _raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error
