"""Where the trainer's stages live over several hosts (services/hosts/placement.py), the caps that follow
(services/trainer/executors.py) and the setting's checks: pure, no job started."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.errors import ConfigError
from services.config import load_settings
from services.config.values import SettingsError
from services.hosts.placement import serving_hosts, stage_owners
from services.trainer.executors import ExecutorChoice, executor_caps


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
