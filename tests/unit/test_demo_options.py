"""``ferret demo``: argument defaults, dataset/model/profile resolution and the children's command lines."""

from __future__ import annotations

import itertools
import json
import logging
from pathlib import Path

import pytest

from ferret_core.errors import ConfigError
from services.cli.main import build_parser
from services.demo import commands
from services.demo.commands import Endpoints
from services.demo.options import (
    PROFILES_DIR,
    DemoOptions,
    committed_profile,
    default_new_budget,
    default_out_dir,
    fresh_topic_prefix,
    resolve_dataset,
    resolve_model,
)


def _options(tmp_path: Path, **overrides: object) -> DemoOptions:
    values: dict[str, object] = {
        "dataset": "digits",
        "model": "mlp",
        "out_dir": tmp_path / "out",
        "topic_prefix": "demo-x",
        "ferret_command": ("ferret",),
    }
    values.update(overrides)
    return DemoOptions(**values)  # type: ignore[arg-type]


def _mnist_root(tmp_path: Path) -> Path:
    (tmp_path / "data" / "MNIST" / "raw").mkdir(parents=True)
    return tmp_path / "data"


def test_dataset_is_mnist_when_its_files_are_there_else_digits(tmp_path: Path) -> None:
    assert resolve_dataset(None, _mnist_root(tmp_path)) == "mnist"
    assert resolve_dataset(None, tmp_path / "nowhere") == "digits"
    assert resolve_dataset(None, None) == "digits"
    assert resolve_dataset("fashion-mnist", None) == "fashion-mnist"


@pytest.mark.parametrize(
    ("dataset", "model"),
    [("mnist", "mnistnet"), ("fashion-mnist", "mnistnet"), ("digits", "mlp"), ("cifar10", "mlp")],
)
def test_model_default_follows_the_input_shape(dataset: str, model: str) -> None:
    assert resolve_model(None, dataset) == model
    assert resolve_model("convnet", dataset) == "convnet"


def test_committed_profile_is_used_only_when_it_fits_the_dataset() -> None:
    assert committed_profile("mnistnet", "mnist") == PROFILES_DIR / "mnistnet.json"
    assert committed_profile("mlp", "mnist") == PROFILES_DIR / "mlp.json"  # 784 inputs either way
    assert committed_profile("mlp", "digits") is None  # 64 inputs: the trainer profiles
    assert committed_profile("resnet18", "cifar10") is None  # committed under resnet18-32.json only


def test_committed_profile_ignores_missing_and_unreadable_files(tmp_path: Path) -> None:
    assert committed_profile("mlp", "mnist", profiles_dir=tmp_path) is None
    (tmp_path / "mlp.json").write_text("{not json")
    assert committed_profile("mlp", "mnist", profiles_dir=tmp_path) is None
    (tmp_path / "mlp.json").write_text(json.dumps({"model": "mlp", "input_shape": [784], "meta": {"num_classes": 100}}))
    assert committed_profile("mlp", "mnist", profiles_dir=tmp_path) is None  # wrong class count


def test_new_budget_default_is_halfway_between_minimum_and_planned() -> None:
    assert default_new_budget(100, 301) == 200
    assert default_new_budget(100, 100) == 100


def test_options_validate_and_derive_the_change_point(tmp_path: Path) -> None:
    options = _options(tmp_path, items=300, change_at=0.4)
    assert options.change_after_predictions == 120
    assert _options(tmp_path, items=7, change_at=0.5).change_after_predictions == 4
    with pytest.raises(ConfigError, match="--items"):
        _options(tmp_path, items=0)
    with pytest.raises(ConfigError, match="--change-at"):
        _options(tmp_path, change_at=1.5)
    with pytest.raises(ConfigError, match="--rate"):
        _options(tmp_path, rate=0.0)


def test_out_dir_and_topic_prefix_are_fresh_per_run() -> None:
    assert default_out_dir("20260101-120000") == Path("out/demo-20260101-120000")
    a, b = fresh_topic_prefix("20260101-120000"), fresh_topic_prefix("20260101-120000")
    assert a.startswith("demo-20260101-120000-") and a != b


def test_cli_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.cli.demo_cmd import options_from_args
    from services.demo import baseline
    from services.demo.options import RATE_OVER_PLAIN

    args = build_parser().parse_args(["demo", "--data-root", str(_mnist_root(tmp_path))])
    assert (args.items, args.rate, args.change_at, args.budget, args.new_budget) == (6000, None, 0.4, None, None)
    assert not args.no_live and args.bootstrap_servers is None and args.redis_url is None
    # the plain loop's rate is measured at start; fixed here (two timings on a loaded machine differ by 2x)
    monkeypatch.setattr(baseline, "plain_loop_rate", lambda dataset, model: 200.0)
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    options = options_from_args(args, stamp="20260101-120000")
    # no --rate: 1.5x what a plain loop trains per second here, a stream it cannot keep up with
    assert RATE_OVER_PLAIN == 1.5 and options.rate == 300.0
    monkeypatch.undo()
    # a model the trainer runs on threads (the digits MLP: well under 1 ms an item) keeps the slow stream
    from services.cli.demo_cmd import default_rate
    from services.demo.options import DEFAULT_RATE

    assert default_rate("digits", "mlp") == DEFAULT_RATE
    assert (options.dataset, options.model) == ("mnist", "mnistnet")
    assert options.profile == PROFILES_DIR / "mnistnet.json"
    assert options.out_dir == Path("out/demo-20260101-120000")
    assert options.topic_prefix.startswith("demo-20260101-120000-")
    assert options.partitions == 2 and options.live and options.budget is None


def test_the_digits_fallback_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from services.cli.demo_cmd import options_from_args

    args = build_parser().parse_args(["demo", "--data-root", str(tmp_path / "nowhere"), "--rate", "50"])
    with caplog.at_level(logging.INFO, logger="ferret.demo"):
        options = options_from_args(args)
    assert options.dataset == "digits"
    assert "no MNIST under the data root" in caplog.text and "--data-root" in caplog.text


def test_cli_flags(tmp_path: Path) -> None:
    from services.cli.demo_cmd import options_from_args

    argv = [
        "demo", "--items", "300", "--dataset", "digits", "--model", "mlp", "--no-live", "--out", str(tmp_path),
        "--rate", "80", "--budget", "512MiB", "--new-budget", "2MB", "--change-at", "0.25",
        "--bootstrap-servers", "127.0.0.1:9092", "--redis-url", "redis://127.0.0.1:6379/0",
    ]  # fmt: skip
    options = options_from_args(build_parser().parse_args(argv))
    assert (options.items, options.dataset, options.model, options.out_dir) == (300, "digits", "mlp", tmp_path)
    assert (options.rate, options.budget, options.new_budget, options.change_at) == (80.0, 512 * 2**20, 2_000_000, 0.25)
    assert options.bootstrap_servers == "127.0.0.1:9092" and options.redis_url == "redis://127.0.0.1:6379/0"
    assert not options.live and options.profile is None


@pytest.mark.parametrize(
    "argv",
    [["--change-at", "1.5"], ["--rate", "0"], ["--items", "0"], ["--budget", "12XB"], ["--dataset", "nope"]],
)
def test_cli_rejects_bad_values_with_usage_status(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["demo", *argv])
    assert exc.value.code == 2


def test_trainer_command_and_environment(tmp_path: Path) -> None:
    options = _options(tmp_path, budget=1000, profile=Path("p.json"), snapshot_interval_s=5.0)
    endpoints = Endpoints("127.0.0.1:1", "redis://127.0.0.1:2/0", "127.0.0.1:3", 4)
    argv = commands.trainer_command(options, endpoints)
    assert argv[:3] == ["ferret", "run", "--supervise"]
    flags = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert flags == {
        "--bootstrap-servers": "127.0.0.1:1",
        "--redis-url": "redis://127.0.0.1:2/0",
        "--topic-prefix": "demo-x",
        "--dataset": "digits",
        "--model": "mlp",
        "--listen": "127.0.0.1:3",
        "--metrics-port": "4",
        "--log-format": "text",
        "--budget": "1000",
        "--profile": "p.json",
    }
    base = {"FERRET_TRAINER_LR": "0.01", "FERRET_KAFKA_INSTANCE_ID": "other"}
    env = commands.trainer_env(options, "k" * 64, base=base)
    assert env["FERRET_TRAINER_LR"] == "0.01"  # the caller's settings pass through
    assert env["FERRET_REDIS_HMAC_KEY"] == "k" * 64  # the stack's key signs the snapshots
    own = commands.trainer_env(options, "k" * 64, base={"FERRET_REDIS_HMAC_KEY": "mine-of-16-bytes-or-more"})
    assert own["FERRET_REDIS_HMAC_KEY"] == "mine-of-16-bytes-or-more"  # unless the caller names its own
    assert env["FERRET_KAFKA_INSTANCE_ID"] == "demo-x"  # fresh per run: no other run's snapshots
    assert env["FERRET_KAFKA_GROUP_ID"] == "demo-x-trainer"
    assert env["FERRET_KAFKA_SAMPLE_PARTITIONS"] == "2"
    assert env["FERRET_REDIS_SNAPSHOT_INTERVAL_S"] == "5"
    unconstrained = commands.trainer_command(_options(tmp_path), endpoints)
    assert "--budget" not in unconstrained and "--profile" not in unconstrained


def test_producer_command(tmp_path: Path) -> None:
    options = _options(tmp_path, items=300, rate=50.0, data_root=Path("/data"))
    argv = commands.producer_command(options, Endpoints("127.0.0.1:1", "redis://x:2/0", "127.0.0.1:3", 4))
    assert argv[:2] == ["ferret", "produce"]
    assert {"--no-create-topics", "--quiet"} <= set(argv)
    flags = {a: b for a, b in itertools.pairwise(argv) if a.startswith("--")}
    assert flags["--items"] == "300" and flags["--rate"] == "50" and flags["--partitions"] == "2"
    assert flags["--topic-prefix"] == "demo-x" and flags["--data-root"] == "/data"
