"""The producer's parts that need no broker: token-bucket pacing, the report, the CLI's flag handling."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from ferret_core.data import Dataset
from ferret_core.errors import ConfigError
from services.cli import produce_cmd
from services.config import KafkaSettings, ProducerSettings, SettingsError, data_root
from services.producer.stream import ProduceReport, SampleProducer, TokenBucket


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_token_bucket_spaces_items_by_the_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, 1, clock)
    assert bucket.reserve() == 100.0  # the first item goes at once
    assert bucket.reserve() == pytest.approx(100.1)
    assert bucket.reserve() == pytest.approx(100.2)  # reserved back to back: the schedule queues up


def test_token_bucket_credits_a_late_wake_up_instead_of_drifting() -> None:
    clock = FakeClock()
    bucket = TokenBucket(10.0, 1, clock)
    bucket.reserve()
    assert bucket.reserve() == pytest.approx(100.1)
    clock.now = 100.13  # woke 30 ms late for item 1
    assert bucket.reserve() == pytest.approx(100.2)  # item 2 keeps its slot on the schedule
    clock.now = 100.5  # idle for a long time: at most `burst` items of credit
    assert bucket.reserve() == pytest.approx(100.5)
    assert bucket.reserve() == pytest.approx(100.6)


def test_token_bucket_bursts() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100.0, 3, clock)
    assert [bucket.reserve() for _ in range(3)] == [100.0] * 3
    assert bucket.reserve() == pytest.approx(100.01)
    with pytest.raises(ConfigError):
        TokenBucket(0.0)


def test_report_lines() -> None:
    report = ProduceReport("ferret.samples", "mnist", produced=10, delivered=10, seconds=2.0, per_partition={0: 10})
    assert report.ok and report.failure_reason() is None
    assert report.summary() == "produced 10 samples to ferret.samples: delivered 10, failed 0 in 2.00 s (5 items/s)"
    failed = ProduceReport("p.samples", "s", produced=4, delivered=3, failed=1, first_error="p.samples: _MSG_TIMED_OUT")
    assert not failed.ok
    assert failed.failure_reason() == "1 of 4 samples were not delivered: p.samples: _MSG_TIMED_OUT"


def tiny_dataset(n: int = 5) -> Dataset:
    x = np.arange(n * 4, dtype=np.uint8).reshape(n, 1, 2, 2)
    y = np.arange(n, dtype=np.int64) % 3
    return Dataset("tiny", x, y, x[:2], y[:2], num_classes=3, input_shape=(1, 2, 2))


@pytest.mark.parametrize(
    ("options", "total"),
    [
        (ProducerSettings(), 5),
        (ProducerSettings(items=12), 12),
        (ProducerSettings(loop=True), None),
        (ProducerSettings(split="test"), 2),
    ],
)
def test_items_per_run(options: ProducerSettings, total: int | None) -> None:
    producer = SampleProducer(tiny_dataset(), KafkaSettings(), options)
    assert producer.total == total
    assert producer.stream == "tiny"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    produce_cmd.register(parser.add_subparsers())
    return parser.parse_args(["produce", *argv])


def test_flags_override_the_config_and_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "ferret.yaml"
    config.write_text("producer:\n  loop: true\n  rate: 50\n  labels: delayed\nkafka:\n  topic_prefix: fromfile\n")
    monkeypatch.setenv("FERRET_KAFKA_BOOTSTRAP_SERVERS", "env:9092")
    args = parse(
        ["--config", str(config), "--items", "100", "--rate", "max", "--partitions", "3", "--dataset", "digits"]
    )
    settings = produce_cmd.settings_from_args(args)
    assert settings.kafka.bootstrap_servers == "env:9092"
    assert (settings.kafka.topic_prefix, settings.kafka.sample_partitions) == ("fromfile", 3)
    options = settings.producer
    assert (options.items, options.loop, options.rate, options.labels) == (100, False, None, "delayed")
    assert options.dataset == "digits"
    unchanged = produce_cmd.settings_from_args(parse(["--config", str(config)])).producer
    assert (unchanged.loop, unchanged.rate) == (True, 50.0)


def test_usage_errors() -> None:
    for argv in (["--rate", "0"], ["--rate", "fast"], ["--burst", "0"], ["--items", "3", "--loop"], ["--items", "-1"]):
        with pytest.raises(SystemExit) as info:
            parse(argv)
        assert info.value.code == 2
    with pytest.raises(SettingsError, match=r"kafka\.bootstrap_servers"):
        produce_cmd.settings_from_args(parse(["--bootstrap-servers", "nohost"]))


def test_default_data_root() -> None:
    root = data_root.default_data_root()
    shared = Path(data_root.__file__).resolve().parents[3] / "shared" / "data"
    assert root == shared if shared.is_dir() else root.parts[-2:] == ("ferret", "data")
