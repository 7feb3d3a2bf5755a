"""``trainer.compensator_settings`` and ``ferret simulate --compensator-setting``: a compensator's
hyper-parameters other than the defaults, checked at load with the entry named, and built into every
stage's compensator (the thread engine here; executor processes: tests/integration/test_process_learner.py)."""

from __future__ import annotations

import json
import math

import pytest

from ferret_core.compensation import CompensatorSettings
from services.cli.main import main as cli_main
from services.config import load_settings
from services.config.values import SettingsError
from services.trainer.engine_learner import EngineLearner
from services.trainer.runner import build_zoo_model
from tests.unit.test_engine_support import make_plan

ENV = "FERRET_TRAINER_COMPENSATOR_SETTINGS"


def test_the_defaults_changed_by_the_mapping() -> None:
    assert load_settings(None, env={}).trainer.compensator_config() == CompensatorSettings()
    settings = load_settings(None, env={ENV: "{dc_lambda0: 200, dc_bound: .inf, eta_lambda: 0}"})
    assert settings.trainer.compensator_config() == CompensatorSettings(
        dc_lambda0=200.0, dc_bound=math.inf, eta_lambda=0.0
    )


@pytest.mark.parametrize(
    ("value", "key", "expected"),
    [
        ("{dc_lamda0: 2}", "dc_lamda0", "expected names of compensator settings (lambda0, eta_lambda"),
        ("{dc_lambda0: lots}", "dc_lambda0", "expected a number (inf where a setting allows it), got 'lots'"),
        ("{dc_momentum: 1}", "dc_momentum", "expected a value within its range (dc_momentum is an EMA coefficient"),
        ("{dc_bound: 0}", "dc_bound", "dc_bound must be a number > 0"),
        ("{dc_lambda0: .inf}", "dc_lambda0", "dc_lambda0 must be a finite number"),
    ],
)
def test_a_bad_entry_is_named_with_what_was_expected(value: str, key: str, expected: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(None, env={ENV: value})
    message = str(info.value)
    assert message.startswith(f"trainer.compensator_settings.{key} (from {ENV}): "), message
    assert expected in message and "docs/compensation.md" in message


def test_the_thread_engines_compensators_are_built_with_them() -> None:
    env = {
        "FERRET_TRAINER_DATASET": "digits",
        "FERRET_TRAINER_MODEL": "mlp",
        "FERRET_TRAINER_COMPENSATOR": "dc-asgd-a",
        ENV: "{dc_lambda0: 3, dc_bound: 0.5}",
    }
    settings = load_settings(None, env=env)
    model = build_zoo_model(settings)
    learner = EngineLearner(model, make_plan(2, 2, num_units=model.num_units), settings)
    try:
        comps = learner.engine.pipeline.compensators
        assert comps and all(c.settings == CompensatorSettings(dc_lambda0=3.0, dc_bound=0.5) for c in comps)
        assert all(s["lambda"] == 3.0 for s in learner.engine.compensator_stats())
    finally:
        learner.close()


def test_simulate_takes_them_and_reports_them(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--dataset", "digits", "--model", "mlp", "--method", "ferret", "--items", "40",
            "--test-items", "20", "--compensator", "dc-asgd-a", "--json"]  # fmt: skip
    assert cli_main([*argv, "--compensator-setting", "dc_lambda0=3", "--compensator-setting", "dc_bound=inf"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["compensator_settings"] == {"dc_lambda0": "3", "dc_bound": "inf"}
    assert report["compensator"] == "dc-asgd-a"
    assert {lam for lam in report["lambda"] if lam is not None} <= {3.0}
    assert cli_main([*argv, "--compensator-setting", "dc_bound=-1"]) != 0
    assert "--compensator-setting dc_bound: expected a value within its range" in capsys.readouterr().err
