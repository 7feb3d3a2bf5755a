"""A job over two "hosts", run by ``tests/integration/test_hosts.py`` as two ``torchrun`` launchers that
meet through c10d rendezvous on loopback. Rank 0 is the coordinator, every other rank serves its stages
(:func:`serve_host`). ``python -m torch.distributed.run ... hosts_job.py SCENARIO OUT.json``."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist
from torch.testing import assert_close

from ferret_core.engine.policies import PolicySetup
from ferret_core.engine.processes import ProcessClock, ProcessSettings
from ferret_core.engine.processes.follow import FOLLOW_SHARE
from ferret_core.engine.processes.hosts import Hosts
from ferret_core.errors import ExecutorLost
from ferret_core.plan import Plan
from ferret_core.planning.host_memory import host_bytes
from ferret_core.planning.memory_model import MemoryModel, MemorySettings
from ferret_core.schedule.scheduler import PlanRules
from services.hosts.job import coordinator_address, join, serve
from tests.unit.test_engine_equivalence import EXACT, plain_sgd
from tests.unit.test_engine_support import make_plan, stream, tiny_units
from tests.unit.test_memory_bound import sized_profile


def setup_for(plan: Plan) -> PolicySetup:
    return PolicySetup("ferret", plan, PlanRules(plan), instant=False, planned=None)


def transparency(hosts: Hosts) -> dict[str, Any]:
    """One worker over 3 stages, stages 1 and 2 owned by the other host, each item trained before the
    next: the same weights as plain SGD, the trace valid across hosts."""
    units, items = tiny_units(), stream(20)
    plan = make_plan(3, 1, num_units=3)
    with ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05), hosts=hosts.place([0, 1, 1])) as clock:
        pids = {f"{n},{j}": p.pid for (n, j), p in clock._processes.items()}
        for item in items:
            arrival = clock.submit(item.x, item.y)
            assert arrival.skipped is None
            clock.drain(timeout=30)
        stages = plan.partition.stages
        state = {
            f"{stages[j][int(k.split('.', 1)[0])]}.{k.split('.', 1)[1]}": v
            for j, tensors in enumerate(clock.master_state())
            for k, v in tensors.items()
        }
        clock.validate()
        updates = [list(row) for row in clock.counters.updates]
        versions = [stage.current_version() for stage in clock.stages]
    reference = plain_sgd(units, items, 0.05)
    assert_close(state, {k: reference[k] for k in state}, **EXACT)
    return {"updates": updates, "pids": pids, "follower_versions": versions, "coordinator_pid": os.getpid()}


def saturated(hosts: Hosts, compensator: str = "none") -> dict[str, Any]:
    """2 workers × 2 stages, stage 1 on the other host, a saturating stream: every item accounted for, the
    trace valid, predictions' freshness measured, each executor's compensator stats (``gap-aware``: stage
    1's shared average step lives on the other host)."""
    units, items = tiny_units(), stream(200)
    plan = make_plan(2, 2, num_units=3)
    settings = ProcessSettings(lr=0.05, compensator=compensator)
    # what each host should hold by the byte model, stages placed as here (sizes from the profiler; times unused)
    memory = MemorySettings(executors="processes", compensator=compensator)
    profile = sized_profile(units, [(1.0, 2.0)] * len(units))
    planned = host_bytes(MemoryModel.for_plan(plan, profile, memory), plan.workers, 2, owners=[0, 1])
    with ProcessClock(units, setup_for(plan), settings, hosts=hosts.place([0, 1])) as clock:
        for item in items:
            clock.submit(item.x, item.y)
            time.sleep(0.002)
        clock.drain(timeout=60)
        c = clock.counters
        assert c.items == 200 and c.trained_any_stage + sum(c.skipped.values()) == 200, c
        clock.validate()
        fresh = hosts.freshness()
        usage = clock.usage()
        shared = clock.shared_bytes()
        reports = clock.compensations()
        measured = clock.measured_host_bytes()
        assert sum(measured) == clock.measured_bytes()
    return {
        "planned_host_bytes": list(planned),
        "measured_host_bytes": list(measured),
        "trained": c.trained,
        "freshness": fresh.__dict__,
        "executors": sorted([u.worker, u.stage, u.pid] for u in usage),
        "shared_bytes": shared,
        "averages": [a is not None for a in clock.averages],
        "compensations": [[r.worker, r.stage, r.stats] for r in reports],
        "follow_shares": {str(rank): share for rank, share in hosts.follow_shares.items()},
    }


def killed(hosts: Hosts) -> dict[str, Any]:
    """kill -9 of an executor on the other host mid-run: the caller gets ExecutorLost within seconds."""
    units, items = tiny_units(), stream(400)
    plan = make_plan(2, 1, num_units=3)
    clock = ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05), hosts=hosts.place([0, 1])).start()
    remote = clock._processes[(0, 1)]
    error = None
    t_kill = None
    try:
        for k, item in enumerate(items):
            if k == 50:
                while remote.pid < 0:
                    time.sleep(0.01)
                os.kill(remote.pid, signal.SIGKILL)  # loopback: the other "host" is this machine
                t_kill = time.perf_counter()
            clock.submit(item.x, item.y)
            time.sleep(0.002)
        clock.drain(timeout=30)
    except ExecutorLost as exc:
        error = f"{type(exc).__name__}: {exc}"
    t_error = time.perf_counter()
    clock.close(reraise=False)
    t_closed = time.perf_counter()
    assert t_kill is not None
    return {
        "error": error,
        "seconds_to_error": t_error - t_kill,
        "seconds_to_closed": t_closed - t_kill,
        "pids": [p for p in (remote.pid,)],
    }


def coordinator_killed(hosts: Hosts, out: str) -> None:
    """kill -9 of the coordinator mid-run: writes what runs on the other host, then dies (the test checks
    that the host's agent and executors end on their own)."""
    units, items = tiny_units(), stream(100)
    plan = make_plan(2, 1, num_units=3)
    clock = ProcessClock(units, setup_for(plan), ProcessSettings(lr=0.05), hosts=hosts.place([0, 1])).start()
    for item in items[:30]:
        clock.submit(item.x, item.y)
    with open(out, "w") as f:
        json.dump({"agent": hosts.host_pids[1], "executors": [clock._processes[(0, 1)].pid]}, f)
    os.kill(os.getpid(), signal.SIGKILL)


def carried(hosts: Hosts) -> dict[str, Any]:
    """Iter-Fisher over 2 workers × 2 stages, stage 1 owned by the other host: the remote stage's λ, v_r and
    v_a are read there (``compensator_states``), loaded into a new clock's stage there, and learnt on from."""
    from ferret_core.compensation import CompensatorSettings
    from ferret_core.engine.carry import carry_compensator_states

    tuning = CompensatorSettings(eta_lambda=0.05)
    plan = make_plan(2, 2, num_units=3)
    settings = ProcessSettings(lr=0.05, compensator="iter-fisher", compensator_settings=tuning, queue_slots=4)
    items = stream(100)

    def train(clock: ProcessClock, part: list[Any]) -> None:
        for burst in range(0, len(part), 20):  # bursts that keep both workers busy: stale gradients
            clock.submit_many([i.x for i in part[burst : burst + 20]], [i.y for i in part[burst : burst + 20]])
            clock.drain(timeout=60)

    placed = hosts.place([0, 1])
    with ProcessClock(tiny_units(), setup_for(plan), settings, hosts=placed) as clock:
        train(clock, items[:60])
        saved = clock.compensator_states()
        applied = {f"{r.worker},{r.stage}": r.stats["lambda"] for r in clock.compensations()}
    with ProcessClock(tiny_units(), setup_for(plan), settings, hosts=placed) as clock:
        fresh = clock.compensator_states()
        clock.load_compensator_states(carry_compensator_states(saved, fresh, same_partition=True))
        loaded = clock.compensator_states()
        train(clock, items[60:])
        after = clock.compensator_states()
    same = [
        bool(all(torch.equal(a, b) for a, b in zip(loaded[j][k], saved[j][k], strict=True)))
        for j in range(2)
        for k in ("v_r", "v_a")
    ]
    return {
        "lambda0": tuning.lambda0,
        "saved": [s["lambda"] for s in saved],
        "pushed": [s["ring"]["pushed"] for s in saved],
        "applied": applied,
        "fresh": [s["lambda"] for s in fresh],
        "loaded": [s["lambda"] for s in loaded],
        "loaded_pushed": [s["ring"]["pushed"] for s in loaded],
        "moments_equal": same,
        "after": [s["lambda"] for s in after],
    }


SCENARIOS = {
    "transparency": transparency,
    "saturated": saturated,
    "saturated-gap-aware": lambda hosts: saturated(hosts, "gap-aware"),
    "saturated-follow-every-update": saturated,  # Hosts(follow_share=1.0): main()
    "killed": killed,
    "carried": carried,
}


def main(scenario: str, out: str) -> None:
    if join() != 0:
        sys.exit(serve())
    share = 1.0 if scenario == "saturated-follow-every-update" else FOLLOW_SHARE
    hosts = Hosts(coordinator_address(), follow_share=share)
    if scenario == "coordinator_killed":
        coordinator_killed(hosts, out)
    result: dict[str, Any] = {"world_size": dist.get_world_size()}
    try:
        result.update(SCENARIOS[scenario](hosts))
        if scenario == "killed":  # the host survives its executor's death: the next clock runs
            result["after"] = transparency(hosts)["updates"]
        result["ok"] = True
    except BaseException:
        result["ok"] = False
        result["traceback"] = traceback.format_exc()
    finally:
        hosts.shutdown()
        with open(out, "w") as f:
            json.dump(result, f)
        dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
