"""The control plane over real gRPC on port 0: plans, status codes, health, watching, snapshots."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from ferret_core.errors import ConfigError, FerretError
from ferret_core.plan import Plan
from services.control.client import ControlCallError, ControlClient
from services.control.deadline import CallDeadline
from services.control.health import LIVENESS, SNAPSHOTS, ControlHealth
from services.control.messages import plan_from_reply
from services.control.server import ControlServer, create_server
from services.control.trainer_port import SnapshotInfo, TrainerStatus
from services.proto_gen.ferret.v1 import control_pb2 as pb

from .control_fakes import FULL_BYTES, MIN_BYTES, PLANNER, FakeTrainer, GatedPlanner, wait_until

MID_BYTES = (MIN_BYTES + FULL_BYTES) // 2


@pytest.fixture
def planner() -> GatedPlanner:
    return GatedPlanner(PLANNER)


@pytest.fixture
def trainer() -> FakeTrainer:
    return FakeTrainer(PLANNER.plan(None))


@pytest.fixture
def control(planner: GatedPlanner, trainer: FakeTrainer) -> Iterator[ControlServer]:
    server = create_server(planner, trainer, max_watchers=2, unary_workers=4).start()
    yield server
    server.stop(grace_s=1.0)


@pytest.fixture
def client(control: ControlServer) -> Iterator[ControlClient]:
    with ControlClient(control.target, timeout_s=10) as c:
        yield c


def test_set_memory_budget_applies_and_returns_the_plan(client: ControlClient, trainer: FakeTrainer) -> None:
    reply = client.set_memory_budget(MID_BYTES)
    plan = plan_from_reply(reply)
    assert plan == PLANNER.plan(MID_BYTES)
    assert isinstance(plan, Plan) and plan.planned_bytes <= MID_BYTES == reply.budget_bytes
    assert reply.plan_version == 2 and trainer.applied == [(plan, 2)]
    assert reply.planning_seconds > 0 and reply.stall_seconds == pytest.approx(0.001)
    assert reply.applied_time_ms > 0
    # typed fields mirror plan_json
    assert list(reply.partition) == list(plan.partition.boundaries)
    assert [list(s.units) for s in reply.stages] == [list(s) for s in plan.stages]
    assert reply.num_workers == plan.num_workers and reply.live_workers == plan.live_workers
    assert [list(w.accumulation) for w in reply.workers] == [list(w.accumulation) for w in plan.workers]
    assert dict(reply.memory_breakdown) == dict(plan.memory_breakdown)
    again = client.get_plan()
    assert plan_from_reply(again) == plan and again.plan_version == 2
    assert again.applied_time_ms == reply.applied_time_ms and again.planning_seconds == 0


def test_budget_below_the_minimum_is_failed_precondition_and_keeps_the_plan(
    client: ControlClient, trainer: FakeTrainer
) -> None:
    before = client.get_plan()
    with pytest.raises(ControlCallError) as err:
        client.set_memory_budget(MIN_BYTES - 1)
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(MIN_BYTES) in err.value.details
    assert err.value.min_feasible_bytes == MIN_BYTES
    after = client.get_plan()
    assert after.plan_json == before.plan_json and after.plan_version == before.plan_version == 1
    assert trainer.applied == []
    assert client.health() == "SERVING"


@pytest.mark.parametrize("budget", [-1, 0, 2**62])
def test_malformed_budget_is_invalid_argument(client: ControlClient, budget: int) -> None:
    with pytest.raises(ControlCallError) as err:
        client.set_memory_budget(budget)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "budget_bytes" in err.value.details


def test_unconstrained_drops_a_budget_set_before(client: ControlClient, trainer: FakeTrainer) -> None:
    budgeted = client.set_memory_budget(MID_BYTES)
    assert budgeted.budget_bytes == MID_BYTES and client.get_status().budget_bytes == MID_BYTES
    reply = client.set_memory_budget(None)  # SetMemoryBudgetRequest(unconstrained=true)
    plan = plan_from_reply(reply)
    assert plan == PLANNER.plan(None) and plan.budget_bytes is None and not reply.HasField("budget_bytes")
    assert reply.plan_version == 3 and trainer.applied[-1] == (plan, 3)
    assert plan_from_reply(client.get_plan()).budget_bytes is None
    assert not client.get_status().HasField("budget_bytes")


def test_budget_requests_old_and_new_on_the_wire(control: ControlServer) -> None:
    """A request with ``budget_bytes`` alone (all a client older than ``unconstrained`` can send) means what
    it meant; ``unconstrained`` with a budget, or an empty request, is INVALID_ARGUMENT and plans nothing."""
    old_client_bytes = pb.SetMemoryBudgetRequest(budget_bytes=MID_BYTES).SerializeToString()
    assert old_client_bytes == b"\x08" + _varint(MID_BYTES)  # field 1 only, as before the new field
    with grpc.insecure_channel(control.target) as channel:
        set_budget = channel.unary_unary(
            "/ferret.v1.Control/SetMemoryBudget",
            request_serializer=lambda raw: raw,
            response_deserializer=pb.PlanReply.FromString,
        )
        assert set_budget(old_client_bytes, timeout=10).budget_bytes == MID_BYTES
        for request in (
            pb.SetMemoryBudgetRequest(budget_bytes=MID_BYTES, unconstrained=True),
            pb.SetMemoryBudgetRequest(),
        ):
            with pytest.raises(grpc.RpcError) as err:
                set_budget(request.SerializeToString(), timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, request
            assert "budget_bytes" in (err.value.details() or "")
    assert control.replanner.generation == 1  # the invalid ones never took a generation


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def test_a_newer_request_supersedes_a_slow_one(
    control: ControlServer, client: ControlClient, planner: GatedPlanner, trainer: FakeTrainer
) -> None:
    entered, release = planner.gate(MID_BYTES)
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(client.set_memory_budget, MID_BYTES)
        assert entered.wait(5)
        newer = pool.submit(client.set_memory_budget, FULL_BYTES)
        wait_until(lambda: control.replanner.generation == 2)
        release.set()
        with pytest.raises(ControlCallError) as err:
            slow.result(5)
        applied = newer.result(5)
    assert err.value.code == grpc.StatusCode.ABORTED and "superseded" in err.value.details
    assert applied.budget_bytes == FULL_BYTES and applied.plan_version == 2
    assert [version for _, version in trainer.applied] == [2]
    assert planner.calls == [MID_BYTES, FULL_BYTES]


def test_readiness_is_not_serving_while_replanning_and_liveness_stays_serving(
    client: ControlClient, planner: GatedPlanner
) -> None:
    assert (client.health(), client.health(LIVENESS)) == ("SERVING", "SERVING")
    entered, release = planner.gate(MID_BYTES)
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.set_memory_budget, MID_BYTES)
        assert entered.wait(5)
        assert client.health() == "NOT_SERVING"
        assert client.health("ferret.v1.Control") == "NOT_SERVING"
        assert client.health(LIVENESS) == "SERVING"
        assert client.get_status().state == pb.SERVICE_STATE_REPLANNING
        release.set()
        pending.result(5)
    assert client.health() == "SERVING"
    assert client.get_status().state == pb.SERVICE_STATE_RUNNING


def test_a_wedged_replan_fails_liveness_until_it_ends(planner: GatedPlanner, trainer: FakeTrainer) -> None:
    control = create_server(planner, trainer, stuck_after_s=0.05).start()
    try:
        with ControlClient(control.target) as client, ThreadPoolExecutor(1) as pool:
            entered, release = planner.gate(MID_BYTES)
            pending = pool.submit(client.set_memory_budget, MID_BYTES)
            assert entered.wait(5)
            wait_until(lambda: client.health(LIVENESS) == "NOT_SERVING")
            release.set()
            pending.result(5)
            assert client.health(LIVENESS) == "SERVING"
    finally:
        control.stop(grace_s=1.0)


def test_degraded_snapshots_part_leaves_readiness_serving(control: ControlServer, client: ControlClient) -> None:
    control.health.set_snapshots_ok(False)
    assert (client.health(), client.health(SNAPSHOTS)) == ("SERVING", "NOT_SERVING")
    control.health.set_snapshots_ok(True)
    assert client.health(SNAPSHOTS) == "SERVING"
    with pytest.raises(ControlCallError) as err:
        client.health("no.such.service")
    assert err.value.code == grpc.StatusCode.NOT_FOUND


def test_shutdown_takes_readiness_down_and_keeps_liveness() -> None:
    health = ControlHealth()
    health.enter_shutdown()
    health.set_ready(True)
    assert not health.ready and health.live


def test_readiness_goes_down_after_owning_no_partition_past_the_bound() -> None:
    """A replica without partitions stays ready for the bound (a rebalance moves them back and forth), then
    readiness is NOT_SERVING until an assignment gives it one; another empty one keeps the first deadline."""
    health = ControlHealth()
    health.set_owns_partitions(False, 0.2)
    assert health.ready
    health.set_owns_partitions(True, 0.2)  # an assignment within the bound: the timer is cancelled
    threading.Event().wait(0.3)
    assert health.ready
    health.set_owns_partitions(False, 0.2)
    threading.Event().wait(0.1)
    health.set_owns_partitions(False, 0.2)  # still none: the deadline does not move
    wait_until(lambda: not health.ready)
    assert health.live
    health.set_owns_partitions(True, 0.2)
    assert health.ready


def test_status_reports_the_trainer_counters(client: ControlClient) -> None:
    reply = client.get_status()
    assert reply.state == pb.SERVICE_STATE_RUNNING and reply.instance_id == "fake-0"
    assert reply.items_received == 10 and dict(reply.items_skipped) == {"busy": 2, "no_label": 1}
    assert reply.items_dead_lettered == 1 and reply.counters["dead_lettered.bad_shape"] == 1
    assert reply.predicted_bytes == FULL_BYTES and reply.plan_version == 1 and reply.time_ms > 0
    assert not reply.HasField("budget_bytes")  # unconstrained start-up plan


def test_watch_status_streams_updates_and_stops_on_cancel(control: ControlServer, client: ControlClient) -> None:
    updates = list(client.watch_status(interval_s=0.01, count=3))
    assert [u.items_received for u in updates] == [10, 20, 30]
    wait_until(lambda: control.servicer.watchers == 0)
    stream = client.watch_status(interval_s=3600)  # only a cancel ends this one quickly
    assert next(stream).items_received == 40
    stream.close()
    wait_until(lambda: control.servicer.watchers == 0)


def test_watch_status_limits_and_validation(control: ControlServer, client: ControlClient) -> None:
    with pytest.raises(ControlCallError) as err:
        next(client.watch_status(interval_s=-1))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    streams = [client.watch_status(interval_s=3600) for _ in range(2)]  # the fixture allows 2
    for stream in streams:
        next(stream)
    with pytest.raises(ControlCallError) as err:
        next(client.watch_status(interval_s=3600))
    assert err.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    for stream in streams:
        stream.close()


def test_server_stop_ends_watch_streams(planner: GatedPlanner, trainer: FakeTrainer) -> None:
    control = create_server(planner, trainer).start()
    with ControlClient(control.target) as client:
        received: list[pb.StatusReply] = []
        started = threading.Event()

        def watch() -> None:
            for reply in client.watch_status(interval_s=3600):
                received.append(reply)
                started.set()

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert started.wait(5)
        control.stop(grace_s=5.0)
        watcher.join(5)
        assert not watcher.is_alive()
    assert [r.state for r in received] == [pb.SERVICE_STATE_RUNNING, pb.SERVICE_STATE_STOPPING]


def test_snapshots_save_list_restore_and_not_found(client: ControlClient, trainer: FakeTrainer) -> None:
    assert client.list_snapshots().latest_version == 0
    with pytest.raises(ControlCallError) as err:
        client.restore_snapshot()
    assert err.value.code == grpc.StatusCode.NOT_FOUND
    first = client.save_snapshot({"why": "test"})
    assert first.version == 1 and first.metadata["why"] == "test" and first.seconds > 0
    client.set_memory_budget(MID_BYTES)
    client.save_snapshot()
    listed = client.list_snapshots()
    assert [s.version for s in listed.snapshots] == [2, 1] and listed.latest_version == 2
    with pytest.raises(ControlCallError) as err:
        client.restore_snapshot(7)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and "7" in err.value.details
    restored = client.restore_snapshot(1)
    assert restored.snapshot.version == 1
    assert plan_from_reply(restored.plan) == PLANNER.plan(None) and restored.plan.plan_version == 3
    with pytest.raises(ControlCallError) as err:
        client.restore_snapshot(0)
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_reflection_lists_the_services(control: ControlServer) -> None:
    with grpc.insecure_channel(control.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (response,) = list(stub.ServerReflectionInfo(iter([request]), timeout=5))
    names = {s.name for s in response.list_services_response.service}
    assert {"ferret.v1.Control", "grpc.health.v1.Health"} <= names


class _BrokenTrainer(FakeTrainer):
    def status(self) -> TrainerStatus:
        raise RuntimeError("counters lost\nsecond line")

    def save_snapshot(self, metadata: Mapping[str, str], deadline: CallDeadline | None = None) -> SnapshotInfo:
        raise FerretError("store unreachable")


def test_other_errors_are_internal_with_a_one_line_reason() -> None:
    control = create_server(PLANNER, _BrokenTrainer(PLANNER.plan(None))).start()
    try:
        with ControlClient(control.target) as client:
            with pytest.raises(ControlCallError) as err:
                client.get_status()
            assert err.value.code == grpc.StatusCode.INTERNAL
            assert err.value.details == "unexpected RuntimeError: counters lost"
            with pytest.raises(ControlCallError) as err:
                client.save_snapshot()
            assert (err.value.code, err.value.details) == (grpc.StatusCode.INTERNAL, "FerretError: store unreachable")
    finally:
        control.stop(grace_s=1.0)


def test_stop_fails_queued_replans_and_keeps_the_plan(planner: GatedPlanner, trainer: FakeTrainer) -> None:
    control = create_server(planner, trainer).start()
    with ControlClient(control.target) as client, ThreadPoolExecutor(3) as pool:
        entered, release = planner.gate(MID_BYTES)
        running = pool.submit(client.set_memory_budget, MID_BYTES)
        assert entered.wait(5)
        queued = pool.submit(client.set_memory_budget, FULL_BYTES)
        wait_until(lambda: control.replanner.generation == 2)
        stopping = pool.submit(control.stop, 5.0)
        with pytest.raises(ControlCallError) as err:
            queued.result(5)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        release.set()
        with pytest.raises(ControlCallError) as err:
            running.result(5)
        assert err.value.code == grpc.StatusCode.ABORTED
        stopping.result(5)
    assert trainer.applied == [] and not control.health.ready and control.health.live


def test_a_port_in_use_is_a_config_error(control: ControlServer, trainer: FakeTrainer) -> None:
    with pytest.raises(ConfigError, match="cannot bind"):
        create_server(PLANNER, trainer, address=control.target)
