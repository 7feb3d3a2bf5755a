"""Snapshots as their own unit (quix-streams' ``checkpointing/checkpoint.py``): what a snapshot holds, in
and out, and the drain → flush → save → commit sequence with its time budget.

A snapshot holds (DESIGN §4 "Offsets and snapshots"): the learner's tensors (weights, ``engine.updates``),
the compensators' state per stage (:func:`encode_compensator`: Iter-Fisher's λ, v_r, v_a and delta ring,
Gap-Aware's step average, the statistics; tensors under ``compensator.<stage>.…`` with the weights, the
rest as JSON in the manifest's ``compensator`` — never pickled), the plan in force and its version, the
stream counters (online accuracy included), per sample partition the smallest offset whose work the
weights do not reflect, and the per-partition "predicted through" watermarks that flag re-emitted
predictions as duplicates after a restart.

Every sequence here runs on the loop thread (the control port hands it over with
:class:`~services.trainer.loop_calls.LoopCalls`), with consumption paused:

1. **drain** the learner, so every dispatched item's backward passes are in the weights;
2. **flush** the producer, so delivered predictions finish their offsets (what is still undelivered
   stays unfinished: the snapshot's offsets then read it again, never skip it);
3. **encode** the payload (``SnapshotStore.prepare``: checked finite, serialised, chunked, checksummed;
   no Redis), then **write** it to Redis (``latest`` switched atomically) and prune on the snapshot write
   thread (:mod:`.snapshot_writes`): the loop goes back to the stream at once and **never waits for
   Redis** (a periodic snapshot; the control plane's SaveSnapshot waits for the write on its own gRPC
   thread, the shutdown for up to its budget);
4. on shutdown only: **store** the finished offsets and **commit** them to the group.

Steps 1–2 share one budget (:data:`SNAPSHOT_BUDGET_S`, :data:`SHUTDOWN_BUDGET_S`): a pipeline that cannot
drain in time fails the snapshot (:class:`CheckpointTimeout`) instead of stalling the stream. Steps 1–3's
part on the loop runs inside ``stall_guard("snapshot", stall_s)``: readiness goes NOT_SERVING while it holds
the record path longer than ``redis.stall_s``. A write hung longer than ``redis.stall_s`` (a frozen Redis;
every command fails after ``redis.timeout_s``, above it) turns ``ferret.snapshots`` NOT_SERVING until it
ends; no second periodic write starts while one runs, and the reconnect ping of a degraded store runs on
the write thread too.

**Start-up** (:meth:`Checkpoints.restore_latest`) never fails on bad snapshot state: orphan chunks of a
writer killed mid-write are swept, then the newest snapshot that verifies *and* matches the configured
model (:class:`~services.snapshots.ModelFingerprint`) is applied; every newer one skipped is logged with
why (corrupt, incompatible). **Redis down** (at start or later): the trainer streams without snapshots,
``ferret.snapshots`` NOT_SERVING (readiness unaffected), and :class:`~services.snapshots.Reconnect` pings
again with backoff only when a snapshot is due; the first due snapshot after Redis answers is saved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from torch import Tensor

from ferret_core.errors import ConfigError, FerretError
from ferret_core.plan import Plan
from services.control.errors import BudgetNotPlanned, SnapshotNotFound
from services.control.trainer_port import PartitionOffset, SnapshotInfo, TrainerState
from services.snapshots import (
    ModelFingerprint,
    PreparedSnapshot,
    Reconnect,
    SnapshotCorruptError,
    SnapshotManifest,
    SnapshotNotFoundError,
    SnapshotPayload,
    SnapshotStore,
    SnapshotUnavailableError,
)
from services.trainer.counters import StreamCounters
from services.trainer.learner import Learner
from services.trainer.ledger import OffsetLedger
from services.trainer.snapshot_writes import WriteQueue, stuck_after
from services.trainer.state import Lifecycle, PlanInForce

log = logging.getLogger("ferret.trainer")

SNAPSHOT_BUDGET_S = 60.0  # drain + flush of a snapshot taken while the stream runs
SHUTDOWN_BUDGET_S = 30.0  # drain + flush on SIGTERM (the demo and k8s give a stopping trainer 60 s / 30 s+)
COMPENSATOR_PREFIX = "compensator."  # snapshot tensor names of the compensators' state


class CheckpointTimeout(FerretError, TimeoutError):
    """The pipeline did not drain within the snapshot's budget; nothing was saved."""


StallGuard = Callable[[str, float], AbstractContextManager[None]]


@contextlib.contextmanager
def no_guard(_what: str, _seconds: float) -> Iterator[None]:
    yield


class StreamEnds(Protocol):
    """What a checkpoint needs of the Kafka side (the record path implements it)."""

    def flush(self, timeout_s: float) -> int:
        """Deliver queued messages; returns how many are still queued."""
        ...

    def store_offsets(self) -> None: ...

    def commit(self) -> None: ...


@dataclass(frozen=True)
class Restored:
    """A snapshot applied to the trainer: what the control plane reports and where consumption resumes."""

    info: SnapshotInfo
    offsets: Mapping[int, int]  # sample partition -> first offset to read


class Deadline:
    """One time budget shared by the steps of a sequence."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._end = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - time.monotonic())


class Checkpoints:
    """Saves and restores snapshots of one trainer replica (module docstring)."""

    def __init__(
        self,
        *,
        store: SnapshotStore | None,
        learner: Learner,
        plan: PlanInForce,
        counters: StreamCounters,
        ledger: OffsetLedger,
        lifecycle: Lifecycle,
        samples_topic: str,
        instance_id: str,
        keep: int,
        interval_s: float,
        snapshot_on_stop: bool = True,
        on_health: Callable[[bool], None] = lambda ok: None,
        link: Reconnect | None = None,
        stall_guard: StallGuard = no_guard,
        stall_s: float = 1.0,
        model_card: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.model_card = dict(model_card or {})  # in every snapshot's meta: what `ferret export` rebuilds
        self.learner = learner
        self.plan = plan
        self.counters = counters
        self.ledger = ledger
        self.lifecycle = lifecycle
        self.samples_topic = samples_topic
        self.instance_id = instance_id
        self.keep = keep
        self.interval_s = interval_s
        self.snapshot_on_stop = snapshot_on_stop
        self._on_health = on_health
        self.link = link  # Redis reachability with backoff; None: assume it answers
        self._stall_guard = stall_guard
        self.stall_s = stall_s  # redis.stall_s: the loop's part (readiness) and a hung write (ferret.snapshots)
        self.last_version = 0  # set by the write thread
        self._last_time = time.monotonic()
        self._writes = WriteQueue()

    # -- the payload, in and out ---------------------------------------------------------------------
    def payload(self, metadata: Mapping[str, str]) -> SnapshotPayload:
        """What the trainer's state is now (call drained and flushed)."""
        plan, version = self.plan.get()
        compensator_tensors, compensator = encode_compensator(self.learner.compensator_state())
        return SnapshotPayload(
            tensors={**self.learner.state_tensors(), **compensator_tensors},
            compensator=compensator,
            plan=plan.to_dict(),
            offsets={self.samples_topic: self.ledger.resume_offsets()},
            counters=self.counters.to_snapshot(),
            meta={
                "plan_version": version,
                "predicted_through": {str(p): o for p, o in self.ledger.predicted_through.items()},
                "instance_id": self.instance_id,
                **({"model_card": self.model_card} if self.model_card else {}),
                **dict(metadata),
            },
        )

    def apply(self, payload: SnapshotPayload) -> Mapping[int, int]:
        """Put a snapshot's state in force (call drained); returns the offsets to resume from."""
        self.learner.load_state_tensors(payload.tensors)
        plan = Plan.from_dict(payload.plan)
        if plan != self.learner.plan:
            try:
                self.learner.apply_plan(plan)
            except BudgetNotPlanned:  # a snapshot of another method: the weights carry over, not its plan
                log.warning("the snapshot's plan is not this method's; keeping the method's own plan")
        if self.learner.plan == plan:
            self.plan.set(plan, int(payload.meta.get("plan_version", self.plan.version)))
        else:
            self.plan.set(self.learner.plan, self.plan.version)
        self._load_compensator(payload)
        self.counters.restore(payload.counters)
        predicted = {int(p): int(o) for p, o in payload.meta.get("predicted_through", {}).items()}
        self.ledger.restore(predicted)
        self.last_version = payload.version or 0
        return {int(p): int(o) for p, o in payload.offsets.get(self.samples_topic, {}).items()}

    def _load_compensator(self, payload: SnapshotPayload) -> None:
        """The compensators' state as saved; a snapshot without it (older, or another compensator or plan
        than the one in force) leaves them fresh, and says so."""
        if not payload.compensator:
            return
        try:
            self.learner.load_compensator_state(decode_compensator(payload.compensator, payload.tensors))
        except (ConfigError, SnapshotCorruptError) as exc:
            log.warning("compensator state not restored (it starts fresh): %s", exc)

    # -- sequences -----------------------------------------------------------------------------------
    def save(self, metadata: Mapping[str, str], ends: StreamEnds) -> SnapshotInfo:
        """A snapshot, waited for (module docstring, steps 1–3). Raises when it failed."""
        return self.start(metadata, ends).result()

    def start(self, metadata: Mapping[str, str], ends: StreamEnds) -> Future[SnapshotInfo]:
        """Drain, flush and encode on this (the loop) thread, then hand the Redis write to the write thread
        and return its future at once. Raises when this thread's part failed (nothing is written)."""
        store = self.require_store()
        began = time.monotonic()
        deadline = Deadline(SNAPSHOT_BUDGET_S)
        self._last_time = began
        try:
            with (
                self.lifecycle.during(TrainerState.SNAPSHOTTING),
                self._stall_guard("snapshot (drain, flush, encode)", self.stall_s),
            ):
                self._drain(deadline)
                self._flush(ends, deadline)
                prepared = store.prepare(self.payload(metadata))
        except Exception:
            self._on_health(False)
            raise
        return self._writes.submit(lambda: self._write(store, prepared, began))

    def _write(self, store: SnapshotStore, prepared: PreparedSnapshot, began: float) -> SnapshotInfo:
        """On the write thread: write, prune, report health (``ferret.snapshots`` NOT_SERVING as soon as the
        write has hung ``stall_s``, whatever the outcome after)."""
        try:
            with stuck_after(self.stall_s, self._stuck):
                manifest = store.write(prepared)
                store.prune(self.keep)
        except Exception as exc:
            self._on_health(False)
            if self.link is not None and _unavailable(exc):
                self.link.failed(exc)  # degraded: the next snapshot waits for a ping to answer
            raise
        self._on_health(True)
        self.last_version = manifest.version
        return self._manifest_info(manifest, seconds=time.monotonic() - began)

    def _stuck(self) -> None:
        log.warning("a snapshot write has hung for more than %.1f s (Redis frozen or overloaded?): "
                    "ferret.snapshots is NOT_SERVING until it ends; the stream goes on", self.stall_s)  # fmt: skip
        self._on_health(False)

    def due(self) -> bool:
        """Whether a periodic snapshot is due (``redis.snapshot_interval_s``; 0 turns them off), no write is
        still running (a hung Redis gets one write at a time) and Redis answers. While the store is
        degraded, the reconnect ping is sent from the write thread when the backoff allows: the loop never
        waits for it; the first call after it answered is due."""
        if self.store is None or self.interval_s <= 0 or time.monotonic() - self._last_time < self.interval_s:
            return False
        if self._writes.busy:
            return False
        if self.link is not None and not self.link.available:
            if self.link.next_retry_in() <= 0:
                self._writes.submit(self.link.check)
            return False
        return True

    def save_periodic(self, ends: StreamEnds) -> None:
        """A periodic snapshot, not waited for; a failure degrades the service (health), the stream goes on."""
        try:
            written = self.start({"reason": "periodic"}, ends)
        except Exception as exc:
            log.error("periodic snapshot failed: %s", exc)
            return
        written.add_done_callback(_log_failure)

    def shutdown(self, ends: StreamEnds) -> None:
        """The SIGTERM sequence (steps 1–4): a failed final snapshot never loses the offsets commit."""
        deadline = Deadline(SHUTDOWN_BUDGET_S)
        drained = True
        try:
            self._drain(deadline)
        except Exception as exc:  # too slow, or the learner failed (what stopped the stream)
            drained = False
            log.error("final drain: %s; no final snapshot", exc)
        self._flush(ends, deadline)
        ends.store_offsets()
        if drained and self.store is not None and self.snapshot_on_stop and (self.link is None or self.link.check()):
            try:
                self.start({"reason": "shutdown"}, ends).result(timeout=max(1.0, deadline.remaining()))
            except TimeoutError:
                log.error("final snapshot: Redis did not finish the write within the shutdown budget; not "
                          "waited for (latest stays the previous one unless it commits before the exit)")  # fmt: skip
            except Exception as exc:
                log.error("final snapshot failed: %s", exc)
        ends.commit()

    def restore_latest(self) -> Restored | None:
        """Start-up (module docstring): orphans swept, then the newest snapshot that verifies and matches
        the configured model, applied; None when there is none, no store, or Redis does not answer (then
        the trainer starts fresh and degraded). Never raises for bad snapshot state."""
        store = self.store
        if store is None:
            return None
        if self.link is not None and not self.link.check():
            log.error("Redis does not answer at start: starting without a snapshot (ferret.snapshots NOT_SERVING)")
            return None
        try:
            store.sweep_orphans()
            choice = store.newest_compatible(self.fingerprint())
        except SnapshotUnavailableError as exc:
            if self.link is not None:
                self.link.failed(exc)
            log.error("Redis failed while reading snapshots (%s): starting without a snapshot", exc)
            return None
        (log.warning if choice.skipped else log.info)("start-up snapshot: %s", choice.describe())
        if choice.payload is None:
            return None
        offsets = self.apply(choice.payload)
        return Restored(self.info(choice.payload), offsets)

    def fingerprint(self) -> ModelFingerprint:
        """The configured model as a restorable snapshot must match it: the plan's model name and the
        names, shapes and dtypes of the learner's ``model.*`` tensors."""
        return ModelFingerprint.of(self.plan.get()[0].model, self.learner.state_tensors())

    def restore(self, version: int | None) -> Restored:
        """A snapshot by version (None: the newest valid one), applied after a drain."""
        store = self.require_store()
        try:
            payload = store.load(version) if version is not None else store.load_latest_valid(self.fingerprint())
        except SnapshotNotFoundError as exc:
            raise SnapshotNotFound(str(exc)) from exc
        with self.lifecycle.during(TrainerState.RESTORING):
            self.learner.drain()
            offsets = self.apply(payload)
        return Restored(self.info(payload), offsets)

    def list(self, verify: bool) -> list[SnapshotInfo]:
        out = []
        for status in self.require_store().list_snapshots(verify=verify):
            if status.manifest is None:
                out.append(SnapshotInfo(status.version, self.instance_id, valid=False, error=status.error))
            else:
                info = self._manifest_info(status.manifest)
                out.append(dataclasses.replace(info, valid=status.valid, error=status.error))
        return out

    def require_store(self) -> SnapshotStore:
        if self.store is None:
            raise SnapshotNotFound("snapshots are off: the trainer has no Redis store configured")
        return self.store

    # -- steps ---------------------------------------------------------------------------------------
    def _drain(self, deadline: Deadline) -> None:
        try:
            self.learner.drain(deadline.remaining())
        except TimeoutError as exc:
            raise CheckpointTimeout(
                f"the pipeline did not drain within {deadline.seconds:g} s; nothing was saved"
            ) from exc

    def _flush(self, ends: StreamEnds, deadline: Deadline) -> None:
        left = ends.flush(deadline.remaining())
        if left:
            log.warning("%d messages still undelivered after the flush: their offsets stay unfinished", left)

    # -- what the control plane reports --------------------------------------------------------------
    def info(self, payload: SnapshotPayload) -> SnapshotInfo:
        if self.store is not None and payload.version:
            return self._manifest_info(self.store.manifest(payload.version))
        return SnapshotInfo(
            version=payload.version or 0,
            instance_id=self.instance_id,
            offsets=_offsets(payload.offsets),
            plan_version=int(payload.meta.get("plan_version", 0)),
        )

    def _manifest_info(self, manifest: SnapshotManifest, *, seconds: float = 0.0) -> SnapshotInfo:
        return SnapshotInfo(
            version=manifest.version,
            instance_id=manifest.instance_id,
            created_time_ms=manifest.created_time_ms,
            chunks=len(manifest.chunks),
            total_bytes=manifest.total_bytes,
            sha256=manifest.sha256,
            offsets=_offsets(manifest.offsets),
            plan_version=int(manifest.meta.get("plan_version", 0)),
            metadata={k: str(v) for k, v in manifest.meta.items() if isinstance(v, str)},
            seconds=seconds,
        )


def encode_compensator(states: Sequence[Mapping[str, Any]]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Per-stage compensator states as ``(tensors, document)``: every tensor under its path
    (``compensator.<stage>.<key>[.<index>…]``), for the snapshot codec (``torch.load(weights_only=True)``),
    and a JSON document of the structure and the scalars that names them (``{}`` without compensators)."""
    tensors: dict[str, Tensor] = {}
    if not states:
        return tensors, {}
    stages = [_split(state, f"{COMPENSATOR_PREFIX}{j}", tensors) for j, state in enumerate(states)]
    return tensors, {"format": 1, "stages": stages}


def decode_compensator(document: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> list[dict[str, Any]]:
    """Inverse of :func:`encode_compensator` (raises ``SnapshotCorruptError`` on a malformed document)."""
    try:
        if document.get("format") != 1:
            raise ValueError(f"format {document.get('format')!r}, expected 1")
        return [_join(stage, tensors) for stage in document["stages"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise SnapshotCorruptError(f"the snapshot's compensator state is malformed: {exc!r}") from exc


def _split(value: Any, path: str, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """One value as a tagged JSON node; tensors go to ``tensors`` under ``path``."""
    if isinstance(value, Tensor):
        tensors[path] = value
        return {"tensor": path}
    if isinstance(value, Mapping):
        return {"dict": {str(k): _split(v, f"{path}.{k}", tensors) for k, v in value.items()}}
    if isinstance(value, list | tuple):
        return {"list": [_split(v, f"{path}.{i}", tensors) for i, v in enumerate(value)]}
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}  # JSON has no NaN / inf
    if value is None or isinstance(value, bool | int | float | str):
        return {"value": value}
    raise TypeError(f"compensator state at {path} holds a {type(value).__name__}: not a tensor, number or string")


def _join(node: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> Any:
    ((tag, value),) = node.items()
    if tag == "tensor":
        return tensors[value]
    if tag == "dict":
        return {k: _join(v, tensors) for k, v in value.items()}
    if tag == "list":
        return [_join(v, tensors) for v in value]
    if tag == "float":
        return float(value)
    if tag == "value":
        return value
    raise ValueError(f"unknown node {tag!r}")


def _offsets(offsets: Mapping[str, Mapping[int, int]]) -> tuple[PartitionOffset, ...]:
    return tuple(
        PartitionOffset(topic, int(p), int(o)) for topic, parts in offsets.items() for p, o in sorted(parts.items())
    )


def _log_failure(written: Future[SnapshotInfo]) -> None:
    error = written.exception()
    if error is not None:
        log.error("periodic snapshot failed: %s", error)


def _unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` (or its cause) says Redis did not answer (unreachable or timed out)."""
    while exc is not None:
        if isinstance(exc, SnapshotUnavailableError | redis.ConnectionError | redis.TimeoutError):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False
