"""Shared version slots (:mod:`ferret_core.engine.processes.slots`), in one process: pins, the free slot an
update writes into, publishing, and the errors a broken schedule gets."""

from __future__ import annotations

import threading

import pytest
import torch

from ferret_core.engine.processes.slots import SharedStageVersions, slots_needed
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ScheduleError


def slots(k: int = 4) -> SharedStageVersions:
    initial = StageVersion(0, 0, (torch.arange(6.0).reshape(2, 3), torch.ones(3)), (torch.zeros(2),))
    return SharedStageVersions(initial, k, threading.Lock(), threading.Lock())


def test_slots_needed_counts_master_replicas_stashes_prediction_and_the_write() -> None:
    assert slots_needed(1, 1, 0) == 1 + 1 + 1 + 1 + 1
    assert slots_needed(2, 3, 0) == 1 + 2 + 2 * 3 + 1 + 1
    assert slots_needed(2, 3, 2) == 1 + 2 + 2 * 1 + 1 + 1


def test_the_master_starts_as_version_0_in_slot_0() -> None:
    s = slots()
    assert s.current() == (0, 0) and s.current_version() == 0
    assert torch.equal(s.copy_current()[0], torch.arange(6.0).reshape(2, 3))
    assert s.readers() == [0, 0, 0, 0]


def test_an_update_never_writes_a_read_slot_and_moves_the_replica() -> None:
    s = slots(4)
    replica = s.pin_current()  # a worker's replica
    stash = s.pin(replica[0])  # an item in flight read it
    assert stash == 0
    out = s.free_slot()
    assert out != 0 and s.readers()[out] == 0
    s.params[out][0].copy_(s.params[0][0] + 1)
    s.publish(out, 1, replica=replica[0])
    assert s.current() == (out, 1)
    assert s.readers()[0] == 1 and s.readers()[out] == 1  # the stash still reads slot 0; the replica moved
    assert s.free_slot() not in (0, out)
    s.unpin(0)
    assert s.free_slot() == 0  # the stash let go: slot 0 may be written again


def test_running_out_of_slots_is_a_schedule_error_with_the_readers() -> None:
    s = slots(3)
    s.pin(0)
    s.pin(1)
    s.pin(2)
    with pytest.raises(ScheduleError, match=r"all 3 version slots are read \(readers \[1, 1, 1\]\)"):
        s.free_slot()


def test_unpinning_more_than_pinned_is_a_schedule_error() -> None:
    s = slots()
    with pytest.raises(ScheduleError, match="unpinned more often than pinned"):
        s.unpin(1)


def test_a_stage_needs_three_slots() -> None:
    with pytest.raises(ScheduleError, match="at least 3"):
        slots(2)


def test_nbytes_counts_every_slot_once() -> None:
    s = slots(4)
    assert s.nbytes() == 4 * (6 + 3) * 4 + 2 * 4 + (1 + 2 * 4) * 8


def test_an_update_writes_in_place_only_where_its_own_replica_is_the_only_reader() -> None:
    s = slots(4)
    replica, _ = s.pin_current()

    def bump() -> None:
        s.params[replica][1].add_(1)

    assert s.write_in_place(replica, 1, bump, 1) and s.current() == (replica, 1)
    assert torch.equal(s.params[replica][1], torch.full((3,), 2.0))
    s.pin(replica)  # a prediction (or a stash) reads the master now: no write in place
    assert not s.write_in_place(replica, 1, bump, 2) and s.current() == (replica, 1)
    assert torch.equal(s.params[replica][1], torch.full((3,), 2.0))


def test_flat_tensors_hold_many_tensors_of_two_dtypes_in_one_buffer_each() -> None:
    from ferret_core.engine.processes.slots import FlatTensors

    like = [torch.zeros(2, 3), torch.zeros(()), torch.zeros(4, dtype=torch.int64), torch.zeros(5)]
    flat = FlatTensors(like, copies=3)
    views = flat.views()
    assert len(views) == 3 and [tuple(t.shape) for t in views[2]] == [(2, 3), (), (4,), (5,)]
    assert len(flat._flat) == 2  # one shared buffer per dtype
    views[1][0].fill_(7)
    views[1][2].fill_(3)
    assert views[0][0].sum() == 0 and views[2][0].sum() == 0 and views[1][0].sum() == 42
    assert views[1][3].sum() == 0 and views[1][2].tolist() == [3, 3, 3, 3]
    assert flat.nbytes() == 3 * (12 * 4 + 4 * 8)


def test_writing_one_slot_does_not_touch_another_slots_autograd_version() -> None:
    """A graph that saved slot 0's weights stays valid while an update writes slot 1 (views of one buffer
    would share one version counter, and autograd would refuse the backward)."""
    s = slots(4)
    weight = s.params[0][0].detach().requires_grad_(True)
    loss = (weight * weight).sum()
    s.params[1][0].add_(1.0)
    s.params[2][1].mul_(2.0)
    (grad,) = torch.autograd.grad(loss, weight)
    assert torch.equal(grad, 2 * torch.arange(6.0).reshape(2, 3))
