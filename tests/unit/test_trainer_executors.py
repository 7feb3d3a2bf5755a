"""Which executors the trainer trains on (services/trainer/executors.py): the ``auto`` rule (CPU, ≥ 2
cores, ≥ 1 ms per item by the profile, a method and compensator that run on processes), a configured
choice, the planner's caps that follow, and a refusal (an error when configured, threads under auto)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferret_core.errors import ConfigError
from ferret_core.profile import ModelProfile
from services.config import Settings, load_settings
from services.trainer.executors import (
    PROCESS_MIN_ITEM_S,
    ExecutorChoice,
    choose_executors,
    executor_caps,
    process_refusal,
    refused,
)
from services.trainer.runner import build_zoo_model, make_planner, plan_executors

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"
MNISTNET = ModelProfile.load(PROFILES / "mnistnet.json")
MLP_DIGITS = ModelProfile.load(PROFILES / "mlp-digits.json")


def _settings(**env: str) -> Settings:
    return load_settings(None, env={f"FERRET_TRAINER_{k.upper()}": v for k, v in env.items()})


def test_auto_picks_processes_where_an_item_pays_for_its_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert MNISTNET.sequential_time >= PROCESS_MIN_ITEM_S > MLP_DIGITS.sequential_time
    choice = choose_executors(_settings(), MNISTNET)
    assert choice.kind == "processes" and not choice.configured
    small = choose_executors(_settings(), MLP_DIGITS)
    assert small.kind == "threads" and "cost more than its training" in small.reason


def test_auto_keeps_threads_on_one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert choose_executors(_settings(), MNISTNET).kind == "threads"


def test_a_configured_kind_is_taken_as_is() -> None:
    assert choose_executors(_settings(executors="threads"), MNISTNET) == ExecutorChoice(
        "threads", "trainer.executors: threads", configured=True
    )
    assert choose_executors(_settings(executors="processes"), MLP_DIGITS).kind == "processes"


def test_processes_on_a_gpu_are_a_config_error() -> None:
    with pytest.raises(ConfigError, match="executors"):
        _settings(executors="processes", device="cuda")


def test_caps_on_processes_leave_a_core_to_the_record_path_and_one_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    processes = ExecutorChoice("processes", "test")
    assert executor_caps(_settings(), processes) == (3, 1)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert executor_caps(_settings(), processes) == (1, 1)
    assert executor_caps(_settings(max_workers="2", max_stages="3"), processes) == (2, 3)
    assert executor_caps(_settings(), ExecutorChoice("threads", "test")) == (1, 1)


def test_the_planner_counts_process_memory_for_processes() -> None:
    settings = _settings(stream_rate="400")
    threads = make_planner(settings, MNISTNET, ExecutorChoice("threads", "test"))
    processes = make_planner(settings, MNISTNET, ExecutorChoice("processes", "test"))
    assert threads.settings.memory.executors == "threads"
    assert processes.settings.memory.executors == "processes"
    assert "version_slots" in processes.plan(None).memory_breakdown


def test_a_method_that_does_not_run_on_processes_falls_back_or_fails() -> None:
    settings = _settings(executors="processes", method="last-n", model="mlp", dataset="digits")
    model = build_zoo_model(settings)
    plan = make_planner(settings, MLP_DIGITS).plan(None)
    refusal = process_refusal(settings, model, MLP_DIGITS, plan)
    assert refusal is not None and "last-n" in refusal
    with pytest.raises(ConfigError, match=r"trainer\.executors is 'processes'"):
        refused(ExecutorChoice("processes", "configured", configured=True), refusal)
    assert refused(ExecutorChoice("processes", "auto"), refusal).kind == "threads"
    with pytest.raises(ConfigError, match=r"set trainer\.executors: threads"):
        plan_executors(settings, model, MLP_DIGITS)


def test_gap_aware_runs_on_processes_over_the_shared_average_step(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    settings = _settings(compensator="gap-aware", stream_rate="400", model="mnistnet", dataset="mnist")
    choice, _, plan = plan_executors(settings, build_zoo_model(settings), MNISTNET)
    assert choice.kind == "processes", choice.reason  # auto no longer falls back to threads for it
    assert "version_slots" in plan.memory_breakdown  # planned with the process byte model


@pytest.mark.parametrize("compensator", ["iter-fisher", "iter-fisher-cf"])
def test_iter_fisher_runs_on_processes_over_the_shared_delta_ring(
    monkeypatch: pytest.MonkeyPatch, compensator: str
) -> None:
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    settings = _settings(compensator=compensator, stream_rate="400", model="mnistnet", dataset="mnist")
    choice, _, _ = plan_executors(settings, build_zoo_model(settings), MNISTNET)
    assert choice.kind == "processes", choice.reason
