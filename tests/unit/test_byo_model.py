"""Bring your own model: the core's contract (ferret_core.zoo.custom), the services' import of
``package.module:factory`` (services.models), weights with weights_only=True, the CLI and the config."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from torch import nn

from ferret_core.errors import ConfigError
from ferret_core.zoo import load_weights, model_from_factory, model_from_units
from services.cli.main import main
from services.config import SettingsError, load_settings
from services.models import build_model_for, check_model_spec, load_factory, parse_shape

ROOT = Path(__file__).resolve().parents[2]
SPEC = "examples.custom_cnn:build"


def small(input_shape: tuple[int, ...], num_classes: int) -> nn.Sequential:
    return nn.Sequential(OrderedDict(flat=nn.Flatten(), fc=nn.Linear(input_shape[-1] * input_shape[-2], num_classes)))


def test_a_sequential_becomes_units_named_after_its_children() -> None:
    model = model_from_factory("small", small, input_shape=(1, 4, 4), num_classes=3)
    assert model.unit_names == ("flat", "fc") and model.num_units == 2
    assert (model.input_shape, model.num_classes, model.num_params) == ((1, 4, 4), 3, 16 * 3 + 3)
    listed = model_from_units("listed", [nn.Flatten(), nn.Linear(16, 3)], input_shape=(16,), num_classes=3)
    assert listed.unit_names == ("flatten0", "linear1")
    numbered = model_from_units("numbered", nn.Sequential(nn.Linear(4, 2)), input_shape=(4,), num_classes=2)
    assert numbered.unit_names == ("linear0",)


def test_the_factory_gets_only_the_keywords_it_accepts_and_is_seeded() -> None:
    calls: list[dict[str, object]] = []

    def only_classes(num_classes: int) -> list[nn.Module]:
        calls.append({"num_classes": num_classes})
        return [nn.Linear(5, num_classes)]

    def anything(**kwargs: object) -> list[nn.Module]:
        calls.append(kwargs)
        return [nn.Linear(5, 2)]

    model_from_factory("a", only_classes, input_shape=(5,), num_classes=4)
    model_from_factory("b", anything, input_shape=(5,), num_classes=2)
    assert calls == [{"num_classes": 4}, {"input_shape": (5,), "num_classes": 2}]
    first = model_from_factory("s", small, input_shape=(1, 4, 4), num_classes=3, seed=7)
    again = model_from_factory("s", small, input_shape=(1, 4, 4), num_classes=3, seed=7)
    other = model_from_factory("s", small, input_shape=(1, 4, 4), num_classes=3, seed=8)
    assert torch.equal(first.units[1].weight, again.units[1].weight)
    assert not torch.equal(first.units[1].weight, other.units[1].weight)


@pytest.mark.parametrize(
    ("built", "shape", "message"),
    [
        (nn.Linear(4, 2), (4,), "returned Linear; expected an nn.Sequential or a list"),
        ([], (4,), "no units"),
        ([nn.Linear(4, 3)], (4,), r"output for one sample is \(1, 3\), expected \(1, 2\)"),
        ([nn.Linear(5, 2)], (4,), r"unit 0 \(linear0\) failed on input \(1, 4\)"),
        ([nn.LSTM(4, 2)], (1, 4), "returned tuple; each unit must return one tensor"),
        ([nn.Linear(4, 2)], (0, 4), "input shape must be positive integers"),
    ],
)
def test_what_the_partitioner_cannot_split_is_refused_with_the_reason(
    built: object, shape: tuple[int, ...], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        model_from_units("m", built, input_shape=shape, num_classes=2)


def test_the_dry_forward_leaves_train_mode_and_batchnorm_statistics_alone() -> None:
    norm = nn.BatchNorm1d(4)
    model = model_from_units("bn", [nn.Linear(4, 4), norm, nn.Linear(4, 2)], input_shape=(4,), num_classes=2)
    assert all(unit.training for unit in model.units)
    assert int(norm.num_batches_tracked) == 0 and torch.equal(norm.running_mean, torch.zeros(4))


def test_a_factory_that_raises_is_reported_with_its_call() -> None:
    def broken(num_classes: int) -> nn.Sequential:
        raise RuntimeError("no GPU here")

    with pytest.raises(ConfigError, match=r"calling the factory\(num_classes=2\) failed: RuntimeError: no GPU here"):
        model_from_factory("broken", broken, input_shape=(4,), num_classes=2)


def test_specs_shapes_and_imports() -> None:
    assert check_model_spec("mnistnet") == "mnistnet" and check_model_spec("a.b_c:make.it") == "a.b_c:make.it"
    for bad in ("nope", "a.b:", ":f", "a b:f", "a:f:g"):
        with pytest.raises(ConfigError, match=r"package\.module:factory"):
            check_model_spec(bad)
    assert parse_shape("1,28,28") == (1, 28, 28) == parse_shape("1x28x28") and parse_shape("64") == (64,)
    for bad in ("", "1,,2", "0,4", "a"):
        with pytest.raises(ValueError, match="per sample"):
            parse_shape(bad)
    assert callable(load_factory(SPEC))
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_pkg.models'.*PYTHONPATH"):
        load_factory("no_such_pkg.models:build")
    with pytest.raises(ConfigError, match=r"has no attribute 'nope'; its callables: \['ResidualBlock', 'build'\]"):
        load_factory("examples.custom_cnn:nope")
    with pytest.raises(ConfigError, match="is a str, expected a callable"):
        load_factory("examples.custom_cnn:__doc__")


def test_the_example_builds_for_mnist_and_digits_and_the_zoo_still_builds() -> None:
    mnist = build_model_for(SPEC, input_shape=(1, 28, 28), num_classes=10)
    digits = build_model_for(SPEC, input_shape=(1, 8, 8), num_classes=10)
    assert mnist.unit_names == digits.unit_names == ("stem", "block", "down", "head")
    assert build_model_for("mlp", input_shape=(64,), num_classes=10).input_shape == (64,)
    assert build_model_for("mnistnet", input_shape=(1, 28, 28), num_classes=10).num_units == 4
    with pytest.raises(ConfigError, match="square images"):
        build_model_for("convnet", input_shape=(3, 32, 30), num_classes=10)


def test_weights_load_with_either_key_style_and_never_unpickle(tmp_path: Path) -> None:
    import examples.custom_cnn as example

    trained = example.build((1, 8, 8), 10)
    with torch.no_grad():
        trained.head[2].weight.fill_(0.5)
    named = tmp_path / "named.pt"
    torch.save(trained.state_dict(), named)  # keys "head.2.weight", as a user saves their model
    loaded = build_model_for(SPEC, input_shape=(1, 8, 8), num_classes=10, weights=named, seed=3)
    assert torch.equal(loaded.units[3][2].weight, torch.full((10, 32), 0.5))
    indexed = tmp_path / "indexed.pt"
    torch.save(loaded.as_sequential().state_dict(), indexed)  # keys "3.2.weight"
    fresh = build_model_for(SPEC, input_shape=(1, 8, 8), num_classes=10, seed=4)
    load_weights(fresh, indexed)
    assert torch.equal(fresh.units[3][2].weight, torch.full((10, 32), 0.5))
    wrong = tmp_path / "wrong.pt"
    torch.save(example.build((1, 8, 8), 7).state_dict(), wrong)
    with pytest.raises(ConfigError, match="wrong shape"):
        build_model_for(SPEC, input_shape=(1, 8, 8), num_classes=10, weights=wrong)
    unsafe = tmp_path / "unsafe.pt"
    torch.save({"stem.0.weight": Path("/etc/passwd")}, unsafe)  # a pickled object, not a tensor
    with pytest.raises(ConfigError, match=r"(?s)cannot be read as a state dict: Weights only load failed"):
        build_model_for(SPEC, input_shape=(1, 8, 8), num_classes=10, weights=unsafe)


def test_profile_then_plan_from_the_profile_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "custom.json"
    argv = ["profile", "--model", SPEC, "--input-shape", "1,8,8", "--warmup", "0", "--repeats", "1"]
    assert main([*argv, "--out", str(profile)]) == 0
    assert json.loads(profile.read_text())["model"] == SPEC
    capsys.readouterr()
    assert main(["plan", "--profile", str(profile), "--json"]) == 0  # no --model: planning needs no weights
    plan = json.loads(capsys.readouterr().out)
    assert plan["model"] == SPEC and plan["planned_bytes"] > 0
    assert main(["plan", "--profile", str(profile), "--model", "mlp"]) == 1
    assert "is for model 'examples.custom_cnn:build' but --model is 'mlp'" in capsys.readouterr().err
    assert main(["profile", "--model", SPEC, "--out", str(tmp_path / "x.json")]) == 1
    assert "pass --input-shape" in capsys.readouterr().err
    assert main(["plan"]) == 1
    assert "give --model" in capsys.readouterr().err


def test_the_console_script_imports_from_the_working_directory(tmp_path: Path) -> None:
    """`ferret` is a script in .venv/bin: the user's package is found from the current directory."""
    (tmp_path / "mymodels.py").write_text(
        "from torch import nn\n\ndef build(num_classes):\n    return [nn.Flatten(), nn.Linear(64, num_classes)]\n"
    )
    ferret = Path(sys.executable).parent / "ferret"
    if not ferret.is_file():
        pytest.skip("the ferret console script is not installed next to this interpreter")
    out = subprocess.run(
        [str(ferret), "plan", "--model", "mymodels:build", "--input-shape", "64", "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["model"] == "mymodels:build"


def test_the_trainer_settings_take_a_factory_shape_classes_and_weights(tmp_path: Path) -> None:
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"")
    env = {
        "FERRET_TRAINER_MODEL": SPEC,
        "FERRET_TRAINER_INPUT_SHAPE": "3,32,32",
        "FERRET_TRAINER_NUM_CLASSES": "100",
        "FERRET_TRAINER_WEIGHTS": str(weights),
    }
    trainer = load_settings(env=env).trainer
    assert (trainer.model, trainer.input_shape) == (SPEC, (3, 32, 32))
    assert (trainer.num_classes, trainer.weights) == (100, weights)
    config = tmp_path / "ferret.yaml"
    config.write_text("trainer:\n  model: mypkg.models:build\n  input_shape: [1, 28, 28]\n")
    assert load_settings(config, env={}).trainer.input_shape == (1, 28, 28)
    with pytest.raises(SettingsError, match=r"trainer\.model.*package\.module:factory"):
        load_settings(env={"FERRET_TRAINER_MODEL": "resnet50"})
    with pytest.raises(SettingsError, match=r"trainer\.input_shape.*1,28,28"):
        load_settings(env={"FERRET_TRAINER_INPUT_SHAPE": "1,-2"})
