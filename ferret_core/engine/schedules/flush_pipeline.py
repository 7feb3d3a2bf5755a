"""What the synchronous schedules' actions do: the engine's pipeline with a flush instead of per-worker
updates, and the zero-bubble B/W split (DAPPLE, Fan et al. PPoPP'21; ZB, Qi et al. 2023; Hanayo, Liu et al.
SC'23 — see :mod:`ferret_core.engine.schedules.synchronous`).

Differences from :class:`~ferret_core.engine.pipeline.Pipeline` (everything else — versions, stashes,
T1's recompute, counting, memory sampling — is the engine's):

* **Gradient accumulation** (:class:`FlushUpdater`). A row keeps one gradient buffer per stage: the
  first gradient of a group is kept as it is, later ones are added into it in place (as
  ``loss.backward()`` accumulates into ``.grad`` between optimizer steps). Every gradient of a group
  read the same version, so nothing is lost by summing before the update: the compensator would see
  τ = 0 anyway.
* **Flush.** When the scheduler reports that the last gradient of a closed group at stage j is in
  (:meth:`FlushScheduler.gradient_done`), the buffers of every row are summed, the optimizer steps the
  master once, the master version advances and *every* row's replica is refreshed to it; one ``U`` is
  recorded (on the executor whose action completed the group). Then the scheduler lifts the barrier.
* **Split backward.** ``B`` runs :func:`~.split_backward.input_gradient` (the graph and the output
  gradient stay with the item), ``W`` runs :func:`~.split_backward.weight_gradients` and hands the
  gradient to the accumulation; at the item's lowest stage ``W`` is the whole (fused) backward. The
  item is trained once its last W is done, which may be a W above its lowest stage.
* **Non-finite gradients** are dropped as in the engine (:meth:`Pipeline._offer_gradient`, both the
  fused and the W path): the group still closes and flushes the finite rest; a group left with no
  finite gradient makes no update but lifts its barrier all the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from ferret_core.compensation import StageCompensator
from ferret_core.engine.memory_meter import StorageKey, storage_keys
from ferret_core.engine.optim import Optimizer
from ferret_core.engine.pipeline import Pipeline
from ferret_core.engine.schedules.split_backward import backward_root, input_gradient, weight_gradients
from ferret_core.engine.stage_exec import StageProgram, backward
from ferret_core.engine.stage_update import StageUpdater, all_finite
from ferret_core.engine.state import Counters, InFlightItem, Stamps
from ferret_core.engine.steps import Algorithm
from ferret_core.engine.trace import TraceSemantics
from ferret_core.engine.versions import StageVersion, VersionStore
from ferret_core.errors import ConfigError, ScheduleError
from ferret_core.plan import Plan
from ferret_core.schedule.actions import Action, Kind
from ferret_core.schedule.flush_scheduler import FlushRules, FlushScheduler


class FlushUpdater(StageUpdater):
    """The engine's stage updater with one gradient sum per row and stage for the open flush group, in place
    of the per-worker accumulation buffers: the gradients are kept as they come and compensated and
    applied at the flush (:meth:`FlushPipeline._flush`)."""

    def __init__(
        self,
        store: VersionStore,
        optimizer: Optimizer,
        compensators: Sequence[StageCompensator],
        algorithm: Algorithm,
        counters: Counters,
        *,
        in_place: bool,
        state_changed: Callable[[], None],
    ) -> None:
        super().__init__(
            store, optimizer, compensators, algorithm, counters, in_place=in_place, state_changed=state_changed
        )
        rows, stages = counters.num_workers, counters.num_stages
        # steps whose gradients each row's one pending buffer per stage sums (an algorithm's penalty scales by it)
        self._held_steps = [[0] * stages for _ in range(rows)]
        # row n, stage j → the group's gradient sum and the version every gradient of it read
        self._pending: list[list[list[tuple[list[Tensor], StageVersion]]]] = [
            [[] for _ in range(stages)] for _ in range(rows)
        ]

    def keep(
        self, worker: int, stage: int, grads: Sequence[Tensor], version: StageVersion, norm: float | None = None
    ) -> bool:
        """Add the gradient into the row's group sum (compensated at the flush: always kept here; ``norm`` is
        not carried: the flush steps the rows' sum)."""
        self._held_steps[worker][stage] += 1
        pending = self._pending[worker][stage]
        if not pending:
            pending.append((list(grads), version))
            return True
        buffer, held = pending[0]
        if held.version != version.version:
            raise ScheduleError(
                f"row {worker} stage {stage}: a gradient read version {version.version} while its group's "
                f"read {held.version}; a flush group must read one version"
            )
        with torch.no_grad():
            torch._foreach_add_(buffer, list(grads))
        return True

    def take_group(self, stage: int) -> tuple[list[tuple[list[Tensor], StageVersion]], int]:
        """Every row's sum of ``stage`` for the flush, with the version it read, and the steps they sum; the
        rows hold none afterwards (call under the stage's lock)."""
        pending = [entry for row in self._pending for entry in row[stage]]
        for row in self._pending:
            row[stage] = []
        steps = sum(row[stage] for row in self._held_steps)
        for held in self._held_steps:
            held[stage] = 0
        return pending, steps

    def pending_steps(self, stage: int) -> int:
        return sum(row[stage] for row in self._held_steps)

    def pending_storages(self) -> Iterator[StorageKey]:
        for row in self._pending:
            for pending in row:
                for grads, version in list(pending):
                    yield from storage_keys(grads)
                    yield from version.storages


class FlushPipeline(Pipeline):
    """The engine's pipeline for a :class:`FlushRules` schedule (see the module docstring)."""

    updater_type = FlushUpdater
    updater: FlushUpdater

    def __init__(
        self,
        plan: Plan,
        rules: FlushRules,
        programs: Sequence[StageProgram],
        initial: Sequence[StageVersion],
        **kwargs: object,
    ) -> None:
        if not isinstance(rules, FlushRules):
            raise ConfigError(
                f"a FlushPipeline runs FlushRules, got {type(rules).__name__}; build a synchronous schedule's "
                "rules with FlushRules (or run other rules on a Pipeline)"
            )
        super().__init__(plan, rules, programs, initial, **kwargs)  # type: ignore[arg-type]
        self.flush_rules = rules
        self.scheduler: FlushScheduler = FlushScheduler(rules)
        self.trace_semantics = TraceSemantics(
            shared_updates=True,
            devices={(n, j): rules.device(n, j) for n in range(rules.num_workers) for j in range(rules.num_stages)}
            if rules.devices
            else None,
            bounds=(0,) * rules.num_stages,
        )
        self._roots: dict[tuple[int, int], Tensor] = {}  # (item, stage) → loss kept between B and W
        if self.meter is not None:
            self.meter.add_source("split_backward_roots", self._root_storages)

    # ------------------------------------------------------------------------------------- execution
    def _run(self, action: Action, stamps: Stamps) -> None:
        if action.kind is Kind.W:
            self._weight_gradient(action, stamps)
        elif action.kind is Kind.B and self.flush_rules.split_backward:
            self._input_gradient(action, stamps)
        else:
            super()._run(action, stamps)

    def _after_gradient(self, a: Action, stamps: Stamps, t_end: float) -> None:
        with self.lock:
            due = self.scheduler.gradient_done(a.item, a.stage)
        if due:
            self._flush(a, stamps, t_end)

    def _flush(self, a: Action, stamps: Stamps, t0: float) -> None:
        """Apply every row's accumulated gradient of the stage once and refresh every row's replica."""
        j = a.stage
        with self.updater.locks[j]:
            read = self.store.master(j).version
            pending, steps = self.updater.take_group(j)
            summed = self._compensated_sum(j, pending)
            del pending
            if summed is None:  # every gradient of the group was non-finite (dropped): no update
                with self.lock:
                    self.scheduler.flushed(j)
                return
            total, stalenesses = summed
            new_params = self.updater.apply(a.worker, j, total, steps)
            del total
            written = self.store.publish(j, new_params)
            del new_params
            for n in range(self.plan.num_workers):
                self.store.refresh(n, j)
            self.end_of_action()
            with self.lock:
                c = self.counters
                c.updates[a.worker][j] += 1
                c.add_staleness(j, stalenesses)
                self._record(Kind.U, a, read, written.version, t0, stamps.end())
                self.scheduler.flushed(j)
                if self.meter is not None:
                    self.meter.invalidate()  # the versions changed
                self._sample()

    def _compensated_sum(
        self, stage: int, pending: list[tuple[list[Tensor], StageVersion]]
    ) -> tuple[list[Tensor], list[int]] | None:
        """Compensate each row's sum from its read version to the master (τ = 0 within a flush group
        unless asked otherwise) and add the rows: the total and the stalenesses (call under the stage's
        lock; ``pending`` is emptied). A row's sum that compensation makes non-finite is dropped (counted
        ``non_finite``, its items no longer known); None when no finite gradient is left."""
        master = self.store.master(stage)
        total: list[Tensor] | None = None
        stalenesses = []
        for grads, version in pending:
            fixed = self.updater.compensate(stage, grads, version)
            if not all_finite(fixed):
                self._count_non_finite(None)
                continue
            stalenesses.append(master.version - version.version)
            total = fixed if total is None else [s + g for s, g in zip(total, fixed, strict=True)]
        pending.clear()
        return None if total is None else (total, stalenesses)

    # ------------------------------------------------------------------------------ split backward
    def _start_backward(self, a: Action, item: InFlightItem, stamps: Stamps) -> tuple[StageVersion, float]:
        version = item.stashes[a.stage]
        if version is None:
            raise ScheduleError(f"{a} on executor {a.worker}/{a.stage}: no stash (its F did not run)")
        t0 = stamps.start()
        if self.plan.workers[a.worker].recompute:
            t0 = self._recompute(a, item, version, stamps, t0)
        return version, t0

    def _root_and_grad_output(self, a: Action, item: InFlightItem) -> tuple[Tensor, Tensor | None]:
        j = a.stage
        graph = item.graphs[j]
        if graph is None:
            raise ScheduleError(f"{a} on executor {a.worker}/{j}: the forward graph is gone")
        if j == self.num_stages - 1:
            with self._saving():
                return backward_root(graph, target=item.target, loss=item.loss), None
        grad_out = item.grad_outputs[j]
        if grad_out is None:
            raise ScheduleError(f"{a} on executor {a.worker}/{j}: no gradient from stage {j + 1}")
        return graph.output, grad_out.to(self._devices[j], non_blocking=True)

    def _input_gradient(self, a: Action, stamps: Stamps) -> None:
        """B of a split backward: the input gradient goes down, graph and output gradient stay for W."""
        j = a.stage
        item = self._items[a.item]
        version, t0 = self._start_backward(a, item, stamps)
        graph = item.graphs[j]
        root, grad_out = self._root_and_grad_output(a, item)
        assert graph is not None
        item.grad_outputs[j - 1] = input_gradient(graph, root, grad_out)
        if grad_out is None:
            self._roots[(a.item, j)] = root
        del graph, root, grad_out
        self.end_of_action()
        with self.lock:
            self._record(Kind.B, a, version.version, None, t0, stamps.end())
            self._sample()

    def _weight_gradient(self, a: Action, stamps: Stamps) -> None:
        """W of a split backward (after its B), or the whole backward at the item's lowest stage."""
        n, j = a.worker, a.stage
        item = self._items[a.item]
        if j == item.lowest:
            version, t0 = self._start_backward(a, item, stamps)
        else:
            stash = item.stashes[j]
            if stash is None:
                raise ScheduleError(f"{a} on executor {n}/{j}: no stash (its F did not run)")
            version, t0 = stash, stamps.start()
        graph = item.graphs[j]
        if graph is None:
            raise ScheduleError(f"{a} on executor {n}/{j}: the forward graph is gone")
        if j == item.lowest:
            last = j == self.num_stages - 1
            grad_out = None if last else item.grad_outputs[j]
            if not last and grad_out is None:
                raise ScheduleError(f"{a} on executor {n}/{j}: no gradient from stage {j + 1}")
            grads, _ = backward(
                graph,
                target=item.target if last and item.loss is None else None,
                loss=item.loss if last else None,
                grad_output=None if grad_out is None else grad_out.to(self._devices[j], non_blocking=True),
            )
        else:
            root = self._roots.pop((a.item, j), None)
            grad_out = item.grad_outputs[j]
            if root is None:
                if grad_out is None:
                    raise ScheduleError(f"{a} on executor {n}/{j}: no gradient from stage {j + 1}")
                root, grad_out = graph.output, grad_out.to(self._devices[j], non_blocking=True)
            grads = weight_gradients(graph, root, grad_out)
            del root
        item.graphs[j] = None
        item.grad_outputs[j] = None
        with self.lock:  # two W of one item may end at once on the wall clock: one of them is its last
            item.stashes[j] = None
            last = all(stash is None for stash in item.stashes)
        del graph, grad_out
        self._offer_gradient(a, grads, version)
        read = version.version
        del grads, version
        self.end_of_action()
        t_end = stamps.end()
        with self.lock:
            self.counters.backwards[n][j] += 1
            self._record(Kind.W, a, read, None, t0, t_end)
            self._sample()
        self._after_gradient(a, stamps, t_end)
        if last:  # its last W (a W above may follow the lowest's)
            self._finish_item(item)

    # ------------------------------------------------------------------------- memory measurement
    def _root_storages(self) -> Iterator[StorageKey]:
        return storage_keys(list(self._roots.values()))
