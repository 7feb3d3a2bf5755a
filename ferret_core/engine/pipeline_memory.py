"""What one pipeline holds, as the memory meter's sources (:mod:`ferret_core.engine.memory_meter`).

Stable sources (their storages change only at an update, where the pipeline invalidates the meter) are
registered first, so a storage two sources share is attributed to them: the versions (masters and
replicas), the optimizer's state and the compensators' state. Then what changes at every action: the
stashes (versions in-flight items read, the few that are no master or replica any more), the in-flight
items' activations, the gradients kept and not yet applied, the OCL algorithm's state and, for a
buffering method, its arrival buffer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ferret_core.engine.memory_meter import MemoryMeter, StorageKey, storage_keys
from ferret_core.engine.stage_update import StageUpdater
from ferret_core.engine.state import InFlightItem
from ferret_core.engine.steps import Algorithm, Feeder
from ferret_core.engine.versions import VersionStore


class PipelineSources:
    """The storages of a pipeline's state by source, read live (``items`` and ``unstarted`` are the
    pipeline's own dicts: in-flight items by index, and the storage keys of those no action has touched
    yet, read instead of walking each waiting item's tensors at every sample)."""

    def __init__(
        self,
        store: VersionStore,
        updater: StageUpdater,
        items: Mapping[int, InFlightItem],
        unstarted: Mapping[int, tuple[StorageKey, ...]],
    ) -> None:
        self._store = store
        self._updater = updater
        self._items = items
        self._unstarted = unstarted

    def register(self, meter: MemoryMeter, algorithm: Algorithm, feeder: Feeder | None) -> None:
        """Add every source to ``meter``, the stable ones first."""
        meter.add_source("versions", self._store.held, stable=True)
        meter.add_source("optimizer", self.optimizer, stable=True)
        meter.add_source("compensators", self.compensators, stable=True)
        meter.add_source("stashes", self.stashes)
        meter.add_source("activations", self.activations)
        meter.add_source("pending_gradients", self._updater.pending_storages)
        meter.add_source("algorithm", lambda: storage_keys(algorithm.state_tensors()))
        if feeder is not None:
            meter.add_source("arrival_buffer", lambda: storage_keys(feeder.state_tensors()))

    def stashes(self) -> Iterator[StorageKey]:
        done = self._store.version_ids()  # most stashes are a replica or the master: counted already
        for item in list(self._items.values()):
            for version in item.stashes:
                if version is not None and id(version) not in done:
                    done.add(id(version))
                    yield from version.storages

    def activations(self) -> Iterator[StorageKey]:
        unstarted = self._unstarted
        for index, item in list(self._items.items()):
            keys = unstarted.get(index)
            yield from storage_keys(item.tensors()) if keys is None else keys

    def optimizer(self) -> Iterator[StorageKey]:
        return storage_keys(self._updater.optimizer.state_tensors())

    def compensators(self) -> Iterator[StorageKey]:
        for compensator in self._updater.compensators:
            yield from compensator.state_storages()
