"""The pure parts of the process clock over several hosts (the job itself: tests/integration/test_hosts.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from ferret_core.engine.processes.hosts import Hosts
from ferret_core.engine.processes.router import lost_neighbour
from ferret_core.engine.processes.slots import FlatTensors, SharedStageVersions
from ferret_core.engine.versions import StageVersion
from ferret_core.errors import ConfigError


def test_a_slot_region_is_the_slot_itself_one_view_per_dtype() -> None:
    """What the follower path sends and receives whole: writing a region writes that slot's tensors, not
    another slot's."""
    like = [torch.zeros(2, 3), torch.zeros(4, dtype=torch.int64), torch.zeros(5)]
    flat = FlatTensors(like, copies=3)
    regions = flat.regions(1)
    assert [r.dtype for r in regions] == [torch.float32, torch.int64]
    assert [r.numel() for r in regions] == [11, 4]
    regions[0].copy_(torch.arange(11.0))
    regions[1].fill_(7)
    a, b, c = flat.views()[1]
    assert torch.equal(a.flatten(), torch.arange(6.0)) and torch.equal(c, torch.arange(6.0, 11.0))
    assert torch.equal(b, torch.full((4,), 7))
    assert all(t.abs().sum() == 0 for k in (0, 2) for t in flat.views()[k])


def test_a_stage_region_follows_its_slot() -> None:
    initial = StageVersion(0, 0, (torch.ones(3), torch.ones(2)), ())
    stage = SharedStageVersions(initial, 4, threading.Lock(), threading.Lock())
    slot = stage.free_slot()
    (region,) = stage.regions(slot)
    region.copy_(torch.arange(5.0))
    stage.publish(slot, 3)
    assert [t.tolist() for t in stage.copy_current()] == [[0.0, 1.0, 2.0], [3.0, 4.0]]
    assert stage.current_version() == 3


def test_hosts_need_torch_distributed_initialised() -> None:
    with pytest.raises(ConfigError, match="torchrun"):
        Hosts("127.0.0.1")


def test_a_remote_answer_is_moved_onto_the_coordinators_clock() -> None:
    update = (4, 5, 10.0, 11.0, [0])
    b = ("B", 7, 4, 1.0, 2.0, 3.0, update, False, 123)
    shifted = Hosts._shift(b, 0.5)
    assert shifted == ("B", 7, 4, 0.5, 1.5, 2.5, (4, 5, 9.5, 10.5, [0]), False, 123)
    f = ("F", 7, 4, 1.0, 2.0, 99)
    assert Hosts._shift(f, 1.0) == ("F", 7, 4, 0.0, 1.0, 99)
    fb = ("FB", ("F", 7, 4, 1.0, 2.0), ("B", 7, 4, 2.0, None, 3.0, None, False), 55)
    assert Hosts._shift(fb, 1.0) == ("FB", ("F", 7, 4, 0.0, 1.0), ("B", 7, 4, 1.0, None, 2.0, None, False), 55)
    assert Hosts._shift(b, 0.0) is b
    assert Hosts._shift(("stats", 1.0), 1.0) == ("stats", 1.0)


def test_a_gloo_connection_to_a_dead_neighbour_is_an_executor_lost_not_an_items_failure() -> None:
    assert lost_neighbour("DistBackendError: [gloo/transport/tcp/pair.cc:534] Connection reset by peer")
    assert lost_neighbour("RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer")
    assert not lost_neighbour("ValueError: expected 10 classes, got 12")
