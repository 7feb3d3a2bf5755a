"""Inputs match the plan: streams are resized to the model's input, profiles taken at
another input shape are refused, and ``ferret simulate --plan`` runs a fixed plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ferret_core.data import Dataset, iter_stream, needs_resize, test_batches
from ferret_core.errors import ConfigError, ProfileError
from ferret_core.profile import LayerProfile, ModelProfile
from services.cli.main import main

PROFILES = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"


def images(n: int, shape: tuple[int, ...]) -> Dataset:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    y = rng.integers(0, 3, size=n).astype(np.int64)
    return Dataset("toy", x, y, x[:5].copy(), y[:5].copy(), 3, shape)


def test_the_stream_is_resized_bilinearly_to_the_model_input() -> None:
    ds = images(6, (3, 8, 8))
    item = next(iter_stream(ds, input_shape=(3, 16, 16)))
    assert item.x.shape == (3, 16, 16)
    expected = torch.nn.functional.interpolate(
        torch.from_numpy(ds.x_train[:1]).float().div(255), size=(16, 16), mode="bilinear", align_corners=False
    )[0]
    torch.testing.assert_close(item.x, expected)
    (x, y), = list(test_batches(ds, (3, 16, 16)))
    assert x.shape == (5, 3, 16, 16) and y.tolist() == ds.y_test.tolist()
    assert next(iter_stream(ds)).x.shape == (3, 8, 8)  # no model shape: untouched
    assert not needs_resize(ds, (3, 8, 8)) and not needs_resize(ds, (192,))  # a flat model of the same size


def test_a_resize_never_changes_channels() -> None:
    with pytest.raises(ConfigError, match="same number of channels"):
        next(iter_stream(images(2, (1, 8, 8)), input_shape=(3, 16, 16)))


def test_a_profile_for_another_input_shape_is_refused() -> None:
    profile = ModelProfile.load(PROFILES / "mobilenet-32.json")
    profile.check_input((3, 32, 32))
    with pytest.raises(ProfileError, match=r"\[3, 32, 32\] but the model takes \[3, 224, 224\]"):
        profile.check_input((3, 224, 224))
    flat = ModelProfile("mlp", (1, 8, 8), (LayerProfile("fc", 1e-4, 1e-4, 650, 10),))
    flat.check_input((64,))  # an MLP flattens its input


def test_plan_refuses_a_profile_made_at_another_input_size(capsys: pytest.CaptureFixture[str]) -> None:
    profile = str(PROFILES / "mobilenet-32.json")
    code = main(["plan", "--model", "mobilenet", "--input-size", "224", "--profile", profile])
    assert code == 1
    assert "taken for input shape [3, 32, 32]" in capsys.readouterr().err


def test_simulate_runs_a_fixed_plan_with_another_compensator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    layers = (  # the digits MLP (64 → 256 → 128 → 10), as in test_engine_cli
        LayerProfile("fc1", 2e-4, 4e-4, params=64 * 256 + 256, activations=256),
        LayerProfile("fc2", 1e-4, 2e-4, params=256 * 128 + 128, activations=128),
        LayerProfile("fc3", 5e-5, 1e-4, params=128 * 10 + 10, activations=10),
    )
    profile = str(tmp_path / "mlp-digits.json")
    ModelProfile("mlp", (1, 8, 8), layers).save(profile)
    plan_file = tmp_path / "plan.json"
    common = ["--model", "mlp", "--profile", profile, "--budget", "600KiB"]
    assert main(["plan", *common, "--compensator", "none", "--in-flight", "schedule", "--json"]) == 0
    plan_file.write_text(capsys.readouterr().out)
    planned = json.loads(plan_file.read_text())
    runs = {}
    for compensator in ("none", "iter-fisher-lean"):
        args = ["simulate", "--dataset", "digits", "--method", "ferret", "--plan", str(plan_file), "--items", "40",
                "--compensator", compensator, "--json", "--model", "mlp", "--profile", profile]
        code = main(args)
        out = capsys.readouterr()
        assert code == 0, out.err
        runs[compensator] = json.loads(out.out)
    for report in runs.values():
        assert report["plan"]["workers"] == planned["workers"]  # the same pipeline for every compensator
        assert report["plan_file"] == str(plan_file)
        assert report["threads"] == 1
    assert runs["iter-fisher-lean"]["compensator"] == "iter-fisher-lean"
