"""Bad settings give one line naming the key, expected and got, with no secret.

Each case guards against a traceback at start (or, for the Redis URL with a wrong scheme, a message
echoing the password).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from ferret_core.errors import ConfigError
from services.cli.main import main
from services.config import MetricsSettings
from services.trainer.metrics_http import serve_metrics

PASSWORD = "hunter2-s3cret"

BAD = {
    "redis-port-not-a-number": ("redis:\n  url: redis://127.0.0.1:abc/0\n", "redis.url", "port"),
    "redis-wrong-scheme": (f"redis:\n  url: http://admin:{PASSWORD}@127.0.0.1:6379/0\n", "redis.url", "redis://"),
    "metrics-address": ("metrics:\n  addr: not an address!\n", "metrics.addr", "IP address or host name"),
    "kafka-unknown-property": ("kafka:\n  properties:\n    foo.bar: '1'\n", "kafka.properties.foo.bar", "foo.bar"),
    "kafka-bad-value": ("kafka:\n  properties:\n    linger.ms: abc\n", "kafka.properties.linger.ms", "Invalid"),
    "kafka-out-of-range": (
        "kafka:\n  properties:\n    linger.ms: '-5'\n",
        "kafka.properties.linger.ms",
        "outside allowed range",
    ),
    "kafka-secret-value": (
        f"kafka:\n  properties:\n    ssl.key.password: {PASSWORD}\n    compression.type: zip\n",
        "kafka.properties",
        "",
    ),
    "input-range": ("trainer:\n  input_range: [5, -5]\n", "trainer.input_range", "low < high"),
    "yaml": ("kafka: [unclosed\n", "not valid YAML at line", ""),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_setting_is_one_line_without_secrets(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text, key, expected = BAD[case]
    config = tmp_path / "ferret.yaml"
    config.write_text(text, encoding="utf-8")
    status = main(["run", "--config", str(config)])
    err = capsys.readouterr().err
    assert status == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert key in err and expected in err and "Traceback" not in err
    assert PASSWORD not in err


def test_redis_url_password_never_shown(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "ferret.yaml"
    config.write_text(f"redis:\n  url: redis://admin:{PASSWORD}@127.0.0.1:abc/0\n", encoding="utf-8")
    assert main(["run", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert PASSWORD not in err and "admin:***@" in err


def registry() -> CollectorRegistry:
    r = CollectorRegistry()
    Counter("ferret_test", "a test counter", registry=r).inc()
    return r


def test_metrics_port_in_use_is_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError) as err:
            serve_metrics(registry(), MetricsSettings(port=port))
    message = str(err.value)
    assert message.startswith("metrics.port: ") and f"127.0.0.1:{port}" in message and "in use" in message
    assert len(message.splitlines()) == 1


def test_metrics_beyond_loopback_needs_a_token_and_checks_it() -> None:
    with pytest.raises(ConfigError, match=r"metrics\.addr: .*beyond loopback"):
        serve_metrics(registry(), MetricsSettings(port=0, addr="0.0.0.0"))
    endpoint = serve_metrics(registry(), MetricsSettings(port=0, addr="0.0.0.0", token=PASSWORD))
    try:
        url = f"http://127.0.0.1:{endpoint.port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(url, timeout=5)
        assert denied.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {PASSWORD}"})
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert b"ferret_test_total 1.0" in reply.read()
    finally:
        endpoint.stop()


def test_unresolvable_metrics_address_is_one_line() -> None:
    with pytest.raises(ConfigError) as err:
        serve_metrics(registry(), MetricsSettings(port=0, addr="no-such-host.invalid", insecure=True))
    assert str(err.value).startswith("metrics.addr: ") and len(str(err.value).splitlines()) == 1


@pytest.mark.integration
def test_ferret_run_with_the_metrics_port_in_use_exits_with_one_line(
    bootstrap_servers: str, redis_url: str, topic_prefix: str, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {
            **os.environ,
            "FERRET_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
            "FERRET_KAFKA_TOPIC_PREFIX": topic_prefix,
            "FERRET_REDIS_URL": redis_url,
            "FERRET_REDIS_HMAC_KEY": "ferret-tests-snapshot-signing-key",
            "FERRET_TRAINER_DATASET": "digits",
            "FERRET_TRAINER_MODEL": "mlp",
            "FERRET_CONTROL_LISTEN": "127.0.0.1:0",
            "FERRET_METRICS_PORT": str(port),
        }
        done = subprocess.run(
            [sys.executable, "-m", "services.cli.main", "run", "--log-level", "ERROR"],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
        )
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.strip().splitlines() if line.startswith("ferret:")]
    assert len(lines) == 1 and "metrics.port" in lines[0] and "Traceback" not in done.stderr
