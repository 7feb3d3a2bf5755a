"""``ferret profile``: writes a loadable profile JSON and prints a table (or the JSON)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from ferret_core.errors import ConfigError
from ferret_core.profile import ModelProfile
from services.cli import main, profile_cmd

FAST = ["--warmup", "0", "--repeats", "1", "--threads", "1"]


def _run(argv: list[str]) -> int:
    """Parse with a parser holding only this command (other commands may not exist yet)."""
    parser = argparse.ArgumentParser(prog="ferret")
    profile_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.handler(args))


def test_the_cli_registry_lists_the_command() -> None:
    assert "services.cli.profile_cmd" in main.COMMAND_MODULES


def test_writes_a_loadable_profile_and_prints_a_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sub" / "mlp.json"
    assert _run(["profile", "--model", "mlp", "--out", str(out), *FAST]) == 0
    profile = ModelProfile.load(out)
    assert profile.model == "mlp" and profile.input_shape == (784,)
    assert [layer.name for layer in profile.layers] == ["fc1", "fc2", "fc3"]
    assert profile.meta["repeats"] == 1 and profile.meta["threads"] == 1
    printed = capsys.readouterr().out
    for text in ("t_f ms", "t_b ms", "params", "activations", "fc1", "total", f"wrote {out}"):
        assert text in printed


def test_json_flag_prints_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "covertype.json"
    argv = [
        "profile",
        "--model",
        "mlp",
        "--in-features",
        "54",
        "--num-classes",
        "7",
        "--out",
        str(out),
        "--json",
    ]
    assert _run([*argv, *FAST]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["input_shape"] == [54]
    assert printed["layers"][-1]["params"] == 128 * 7 + 7
    assert set(printed) >= {"model", "input_shape", "device", "dtype", "time_unit", "layers"}


def test_input_size_reaches_the_model(tmp_path: Path) -> None:
    out = tmp_path / "convnet.json"
    assert _run(["profile", "--model", "convnet", "--input-size", "16", "--out", str(out), *FAST]) == 0
    assert ModelProfile.load(out).input_shape == (3, 16, 16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_cuda_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        _run(["profile", "--model", "mlp", "--device", "cuda", "--out", str(tmp_path / "x.json"), *FAST])
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["profile", "--model", "vgg", "--out", "x.json"],
        ["profile", "--model", "mlp"],
        ["profile", "--model", "mlp", "--out", "x.json", "--repeats", "0"],
        ["profile", "--model", "mlp", "--out", "x.json", "--dtype", "int8"],
    ],
)
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _run(argv)
    assert exc.value.code == 2


def test_model_errors_are_ferret_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="mlp only"):
        _run(["profile", "--model", "convnet", "--in-features", "5", "--out", str(tmp_path / "x.json"), *FAST])


def test_through_the_ferret_entry_point(tmp_path: Path) -> None:
    pytest.importorskip("services.cli.plan_cmd", reason="`ferret` needs every registered command")
    assert main.main(["profile", "--model", "mlp", "--out", str(tmp_path / "m.json"), *FAST]) == 0
    assert ModelProfile.load(tmp_path / "m.json").num_units == 3
    if not torch.cuda.is_available():  # a FerretError becomes exit status 1 with a one-line reason
        assert main.main(["profile", "--model", "mlp", "--device", "cuda", "--out", str(tmp_path / "c.json")]) == 1
