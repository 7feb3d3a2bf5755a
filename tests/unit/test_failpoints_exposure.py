"""Failpoints, the exposure policy and the snapshot store's reconnect backoff (no services needed)."""

from __future__ import annotations

import random

import pytest

from ferret_core.errors import ConfigError
from services import failpoints
from services.exposure import check_exposure, is_loopback
from services.snapshots import Backoff, Reconnect, SnapshotUnavailableError


def test_failpoints_parse_and_trigger() -> None:
    assert failpoints.parse("snapshot.mid-write, control.mid-replan:kill") == {
        "snapshot.mid-write": "raise",
        "control.mid-replan": "kill",
    }
    with pytest.raises(ConfigError, match=r"unknown failpoint 'snapshot\.midwrite'"):
        failpoints.parse("snapshot.midwrite")
    with pytest.raises(ConfigError, match="unknown action 'explode'"):
        failpoints.parse("snapshot.mid-write:explode")
    failpoints.configure({failpoints.ENV: "snapshot.mid-write"})
    try:
        with pytest.raises(failpoints.FailpointError):
            failpoints.failpoint("snapshot.mid-write")
        failpoints.failpoint("control.mid-replan")  # not enabled: nothing happens
    finally:
        failpoints.configure({})
    failpoints.failpoint("snapshot.mid-write")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.3.4.5", True), ("localhost", True), ("[::1]", True), ("::1", True),
     ("0.0.0.0", False), ("", False), ("[::]", False), ("10.0.0.7", False), ("trainer-0.svc", False)],
)  # fmt: skip
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_exposure_needs_auth_or_insecure(caplog: pytest.LogCaptureFixture) -> None:
    check_exposure("x", "control.listen", "127.0.0.1", authenticated=False, insecure=False)
    check_exposure("x", "control.listen", "0.0.0.0", authenticated=True, insecure=False)
    with pytest.raises(ConfigError, match=r"^control\.listen: .*control\.insecure: true"):
        check_exposure("x", "control.listen", "0.0.0.0", authenticated=False, insecure=False)
    check_exposure("x", "control.listen", "0.0.0.0", authenticated=False, insecure=True)
    assert "without authentication" in caplog.text


def test_reconnect_backs_off_then_recovers() -> None:
    now = [0.0]
    up = [False]
    pings: list[float] = []
    changes: list[bool] = []

    def ping() -> None:
        pings.append(now[0])
        if not up[0]:
            raise SnapshotUnavailableError("down")

    link = Reconnect(
        ping, backoff=Backoff(initial_s=1, max_s=4, jitter=0), on_change=changes.append,
        clock=lambda: now[0], rng=random.Random(0),
    )  # fmt: skip
    for t in range(0, 20):
        now[0] = float(t)
        link.check()
    assert pings == [0.0, 1.0, 3.0, 7.0, 11.0, 15.0, 19.0]  # 1, 2, 4, then capped at 4
    assert changes == [False] and link.next_retry_in() == 4.0
    up[0] = True
    now[0] = 23.0
    assert link.check() and changes == [False, True] and link.check()
    assert len(pings) == 8  # no ping while up
    link.failed(SnapshotUnavailableError("again"))
    assert not link.available and changes == [False, True, False] and link.next_retry_in() == 1.0
