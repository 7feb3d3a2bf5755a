"""Where the trainer's stages live over several hosts (ferret_core/planning/placement.py), the caps that follow
(services/trainer/executors.py), the per-host budget and the settings' checks: pure, no job started."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.errors import ConfigError, InfeasibleHostBudgetError
from ferret_core.planning.placement import serving_hosts, stage_owners
from ferret_core.profile import ModelProfile
from services.config import load_settings
from services.config.values import SettingsError
from services.trainer.executors import ExecutorChoice, executor_caps
from services.trainer.runner import make_planner

ROOT = Path(__file__).resolve().parents[2]


@given(st.integers(1, 64), st.integers(2, 16))
def test_stages_go_to_the_other_hosts_in_contiguous_blocks(stages: int, hosts: int) -> None:
    owners = stage_owners(stages, hosts)
    assert len(owners) == stages
    assert all(1 <= o < hosts for o in owners)  # never the trainer's rank 0: it keeps the record path
    assert list(owners) == sorted(owners)  # neighbouring stages on the same or the next host
    used = set(owners)
    assert len(used) == min(stages, hosts - 1)  # every serving host gets a stage while there are enough
    counts = [owners.count(r) for r in used]
    assert max(counts) - min(counts) <= 1  # balanced


def test_one_host_owns_everything_and_nonsense_is_refused() -> None:
    assert stage_owners(3, 1) == (0, 0, 0)
    assert stage_owners(1, 2) == (1,) and stage_owners(2, 3) == (1, 2) and stage_owners(3, 2) == (1, 1, 1)
    assert serving_hosts(1) == 1 and serving_hosts(4) == 3
    with pytest.raises(ConfigError, match="got 0 stage"):
        stage_owners(0, 2)


def test_caps_over_hosts_are_the_serving_hosts_cores_and_count() -> None:
    settings = load_settings(None, env={})
    over = ExecutorChoice("processes", "hosts", configured=True, hosts=3)
    workers, stages = executor_caps(settings, over)
    assert stages == 2 and workers >= 1  # one stage per serving host; no core kept for a record path there
    t = dataclasses.replace(settings.trainer, max_workers=5, max_stages=4)
    assert executor_caps(dataclasses.replace(settings, trainer=t), over) == (5, 4)  # the settings override


@pytest.mark.parametrize(
    "env",
    [
        {"FERRET_TRAINER_HOSTS": "torchrun", "FERRET_TRAINER_EXECUTORS": "threads"},
        {"FERRET_TRAINER_HOSTS": "torchrun", "FERRET_TRAINER_DEVICE": "cuda"},
    ],
)
def test_hosts_need_cpu_executor_processes(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match=r"trainer\.hosts"):
        load_settings(None, env=env)


def test_hosts_default_off_and_unknown_values_are_refused() -> None:
    assert load_settings(None, env={}).trainer.hosts == "off"
    with pytest.raises(SettingsError, match=r"trainer\.hosts"):
        load_settings(None, env={"FERRET_TRAINER_HOSTS": "mpi"})


def test_a_host_budget_needs_hosts_and_reads_like_a_budget() -> None:
    with pytest.raises(SettingsError, match=r"trainer\.host_budget_bytes"):
        load_settings(None, env={"FERRET_TRAINER_HOST_BUDGET_BYTES": "64MiB"})
    loaded = load_settings(None, env={"FERRET_TRAINER_HOSTS": "torchrun", "FERRET_TRAINER_HOST_BUDGET_BYTES": "64MiB"})
    assert loaded.trainer.host_budget_bytes == 64 * 2**20
    with pytest.raises(SettingsError, match=r"trainer\.host_budget_bytes"):
        load_settings(None, env={"FERRET_TRAINER_HOSTS": "torchrun", "FERRET_TRAINER_HOST_BUDGET_BYTES": "0"})


def test_the_trainers_planner_keeps_every_host_within_its_budget() -> None:
    """Over 3 hosts the trainer's start-up planner reports each host's bytes, and a per-host budget below
    the unconstrained plan's fullest host gives a plan whose every host fits it (rank 0: the follower copies)."""
    profile = ModelProfile.from_dict(json.loads((ROOT / "benchmarks/profiles/mnistnet-batches.json").read_text()))
    env = {"FERRET_TRAINER_HOSTS": "torchrun", "FERRET_TRAINER_STREAM_RATE": "1500"}
    over = ExecutorChoice("processes", "hosts", configured=True, hosts=3)
    free = make_planner(load_settings(None, env=env), profile, over).plan(None)
    assert len(free.host_bytes) == 3 and free.host_bytes[0] > 0
    budget = int(0.8 * max(free.host_bytes))
    env["FERRET_TRAINER_HOST_BUDGET_BYTES"] = str(budget)
    bounded = make_planner(load_settings(None, env=env), profile, over).plan(None)
    assert max(bounded.host_bytes) <= budget < max(free.host_bytes)
    env["FERRET_TRAINER_HOST_BUDGET_BYTES"] = "1000"
    with pytest.raises(InfeasibleHostBudgetError, match="raise the per-host budget"):
        make_planner(load_settings(None, env=env), profile, over).warm()
