"""The start-up plan is made in the machine's time: a few training steps timed here, ÷ the profile's time
per item (services/trainer/calibration.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ferret_core.profile import ModelProfile
from services.config import load_settings
from services.trainer import calibration
from services.trainer.runner import build_zoo_model, plan_executors, start_time_scale

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"
MNISTNET = ModelProfile.load(PROFILES / "mnistnet.json")  # 1.09 ms per item by the profile


def _env(**extra: str) -> dict[str, str]:
    return {"FERRET_TRAINER_PROFILE": str(PROFILES / "mnistnet.json"), **extra}


def test_timing_steps_leaves_the_model_as_it_was_and_takes_a_positive_time() -> None:
    model = build_zoo_model(load_settings(None, env=_env()))
    before = {k: v.clone() for k, v in model.as_sequential().state_dict().items()}
    seconds = calibration.step_seconds(model, torch.device("cpu"), max_seconds=0.05)
    assert seconds > 0
    after = model.as_sequential().state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_the_scale_is_the_measured_step_over_the_profiles_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration, "step_seconds", lambda model, device: 4 * MNISTNET.sequential_time)
    settings = load_settings(None, env=_env(FERRET_TRAINER_CALIBRATE_TIME="true"))
    model = build_zoo_model(settings)
    assert start_time_scale(settings, model, MNISTNET) == pytest.approx(4.0)
    # off (the default), or a configured interval (the paper's protocol): the profile's own time
    assert start_time_scale(load_settings(None, env=_env()), model, MNISTNET) == 1
    auto = load_settings(None, env=_env(FERRET_TRAINER_ARRIVAL_INTERVAL="auto", FERRET_TRAINER_CALIBRATE_TIME="true"))
    assert start_time_scale(auto, model, MNISTNET) == 1


def test_a_stream_one_worker_cannot_keep_up_with_in_this_machines_time_gets_more_workers() -> None:
    """392 items/s (2.55 ms apart): by the profile (1.09 ms per item) one worker keeps up, so the start-up
    plan was 1 × 1 (the 16-core GPU host, stop 31); at the measured 4× (4.4 ms) it cannot, and the process
    executors' plan has several workers."""
    env = _env(FERRET_TRAINER_STREAM_RATE="392", FERRET_TRAINER_EXECUTORS="processes", FERRET_TRAINER_MAX_WORKERS="8")
    settings = load_settings(None, env=env)
    model = build_zoo_model(settings)
    _, _, profile_time = plan_executors(settings, model, MNISTNET, time_scale=1.0)
    _, _, machine_time = plan_executors(settings, model, MNISTNET, time_scale=4.0)
    assert profile_time.num_workers == 1
    assert machine_time.num_workers >= 2
