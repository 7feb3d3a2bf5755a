"""The follower copies of remote stages: how a host sends its newest master and the coordinator takes it.

Over several hosts the coordinator predicts with a copy of every remote stage's master (:mod:`.hosts`).
After updates, the owning host sends the newest master of each stage that moved: a header (the stage,
its version) and then the slot's parameters straight from shared memory, one contiguous region per dtype
(:meth:`SharedStageVersions.regions`), which the coordinator receives straight into a free slot of its
follower and publishes: no pickling, no copy but the network's. Sending costs CPU on both ends (45 MB per
ResNet-18 master), so the host spends at most a *share* of the follower thread's time sending (the
coordinator's ``Hosts(follow_share=...)``, :data:`FOLLOW_SHARE` by default; ``trainer.follow_share``):
after a send of d seconds it waits :func:`pause_after_send` = d·(1/share − 1) before the next, and then
sends only the newest version (coalesced). Share 1 sends again as soon as a send ends: the freshest
predictions, for the most CPU on both ends. A header with stage :data:`END_OF_SESSION` says the host
sent its last master of a clock; :data:`BYE` that the host is leaving.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ferret_core.engine.processes.link import TAG_MASTER
from ferret_core.engine.processes.slots import SharedStageVersions
from ferret_core.errors import ConfigError

FOLLOW_SHARE = 0.25  # most of the follower thread's wall time a host spends sending masters (default)
END_OF_SESSION = -2
BYE = -1


def check_follow_share(share: float) -> float:
    """``share`` if it is a share of a thread's time in (0, 1], else a :class:`ConfigError` saying so."""
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 < share <= 1.0:
        raise ConfigError(
            f"follow share must be in (0, 1] (the most of the follower thread's time a host spends sending "
            f"masters; 1: send after every update), got {share!r}"
        )
    return float(share)


def pause_after_send(spent_s: float, share: float) -> float:
    """Seconds to wait after a send that took ``spent_s`` so that sending takes at most ``share`` of the
    follower thread's time: d·(1/share − 1) (0 at share 1)."""
    return spent_s * (1.0 / share - 1.0)


def send_master(stage: SharedStageVersions, dst: int, group: Any = None) -> int:
    """Send ``stage``'s current master (pinned while it is read) to rank ``dst``; returns its version."""
    slot, version = stage.pin_current()
    try:
        dist.send(torch.tensor([stage.stage, version], dtype=torch.int64), dst, group=group, tag=TAG_MASTER)
        for region in stage.regions(slot):
            dist.send(region, dst, group=group, tag=TAG_MASTER)
    finally:
        stage.unpin(slot)
    return version


def send_marker(marker: int, dst: int, group: Any = None) -> None:
    """Send :data:`END_OF_SESSION` or :data:`BYE` on the masters' channel."""
    dist.send(torch.tensor([marker, -1], dtype=torch.int64), dst, group=group, tag=TAG_MASTER)


def recv_header(src: int, group: Any = None) -> tuple[int, int]:
    """The next (stage, version) on the masters' channel from ``src`` (stage < 0: a marker)."""
    header = torch.zeros(2, dtype=torch.int64)
    dist.recv(header, src, group=group, tag=TAG_MASTER)
    stage, version = header.tolist()
    return int(stage), int(version)


def recv_master(follower: SharedStageVersions, version: int, src: int, group: Any = None) -> None:
    """Receive the master that follows a header into a free slot of ``follower`` and publish it there if it
    is newer than the follower's (under the follower's update lock: one writer)."""
    with follower.update_lock:
        slot = follower.free_slot()
        for region in follower.regions(slot):
            dist.recv(region, src, group=group, tag=TAG_MASTER)
        if version > follower.current_version():
            follower.publish(slot, version)
