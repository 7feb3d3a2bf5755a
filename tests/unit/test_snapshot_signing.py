"""Snapshots are signed unless unsigned ones are an explicit choice (issue 26, item 4): a trainer without
``redis.hmac_key`` and without ``redis.allow_unsigned`` refuses to start, naming both fixes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ferret_core.errors import ConfigError
from services.cli.main import main
from services.config import RedisSettings, SettingsError, load_settings
from services.snapshots import signing_key
from services.trainer.runner import start_trainer

KEY = "a-key-of-at-least-16-bytes"


def test_without_a_key_or_the_opt_in_the_error_names_both_fixes() -> None:
    with pytest.raises(SettingsError) as info:
        signing_key(RedisSettings())
    message = str(info.value)
    assert message.startswith("redis.hmac_key: expected a key to sign snapshots with")
    assert "FERRET_REDIS_HMAC_KEY" in message and "redis.allow_unsigned: true" in message
    assert isinstance(info.value, ConfigError)


def test_the_key_signs_and_the_opt_in_is_unsigned_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="services.snapshots.signing"):
        assert signing_key(RedisSettings(hmac_key=KEY)) == KEY.encode()
        assert caplog.records == []
        assert signing_key(RedisSettings(allow_unsigned=True)) is None
        assert "snapshots are unsigned (redis.allow_unsigned: true)" in caplog.text
        caplog.clear()
        assert signing_key(RedisSettings(hmac_key=KEY, allow_unsigned=True)) == KEY.encode()  # the key wins
        assert "redis.allow_unsigned is ignored" in caplog.text


def test_the_opt_in_is_a_setting_from_the_file_or_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "ferret.yaml"
    config.write_text("redis:\n  allow_unsigned: true\n", encoding="utf-8")
    assert load_settings(config, env={}).redis.allow_unsigned is True
    assert load_settings(None, env={"FERRET_REDIS_ALLOW_UNSIGNED": "yes"}).redis.allow_unsigned is True
    assert load_settings(None, env={}).redis.allow_unsigned is False


def test_start_trainer_refuses_before_touching_kafka_or_redis() -> None:
    """Nothing listens on the settings' broker and Redis: the refusal comes before either is reached."""
    env = {"FERRET_KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "FERRET_REDIS_URL": "redis://127.0.0.1:1/0"}
    settings = load_settings(None, env={**env, "FERRET_TRAINER_DATASET": "digits", "FERRET_TRAINER_MODEL": "mlp"})
    with pytest.raises(SettingsError, match=r"^redis\.hmac_key: .*redis\.allow_unsigned: true"):
        start_trainer(settings)


def test_ferret_run_without_a_key_exits_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("FERRET_REDIS_HMAC_KEY", raising=False)
    monkeypatch.delenv("FERRET_REDIS_ALLOW_UNSIGNED", raising=False)
    config = tmp_path / "ferret.yaml"
    config.write_text("trainer:\n  dataset: digits\n  model: mlp\n", encoding="utf-8")
    assert main(["run", "--config", str(config), "--bootstrap-servers", "127.0.0.1:1"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "redis.hmac_key" in err[0] and "redis.allow_unsigned" in err[0], err
