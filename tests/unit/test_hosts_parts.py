"""The pure parts of the process clock over several hosts (the job itself: tests/integration/test_hosts.py)."""

from __future__ import annotations

import threading

import pytest
import torch

from ferret_core.engine.processes.follow import FOLLOW_SHARE, check_follow_share, pause_after_send
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


@pytest.mark.parametrize("share", [0.25, 0.5, 1.0])
def test_a_host_spends_at_most_its_follow_share_sending(share: float) -> None:
    """After each send of d seconds the follower waits d·(1/share − 1): over any run of sends and waits,
    sending is ``share`` of the thread's time; share 1 sends again at once."""
    sends = [0.004, 0.010, 0.0005, 0.020]
    waits = [pause_after_send(d, share) for d in sends]
    assert sum(sends) / (sum(sends) + sum(waits)) == pytest.approx(share)
    assert (share == 1.0) == all(w == 0.0 for w in waits)


@pytest.mark.parametrize("share", [0, -0.5, 1.5, float("nan"), True, "0.5"])
def test_a_follow_share_outside_0_1_is_refused(share: object) -> None:
    with pytest.raises(ConfigError, match=r"follow share must be in \(0, 1\]"):
        check_follow_share(share)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="follow share"):  # before anything else: no job needed to be told
        Hosts("127.0.0.1", follow_share=share)  # type: ignore[arg-type]


def test_the_trainer_setting_reaches_its_hosts_and_is_checked() -> None:
    from services.config import SettingsError, load_settings

    assert load_settings(env={}).trainer.follow_share == FOLLOW_SHARE
    assert load_settings(env={"FERRET_TRAINER_FOLLOW_SHARE": "1"}).trainer.follow_share == 1.0
    with pytest.raises(SettingsError, match="follow_share"):
        load_settings(env={"FERRET_TRAINER_FOLLOW_SHARE": "0"})
