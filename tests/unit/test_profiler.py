"""The layer profiler: one row per unit, direct counts, positive times, no mutation, JSON round trip."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from ferret_core.errors import ConfigError, ProfileError
from ferret_core.planning.profiler import profile_model
from ferret_core.profile import LayerProfile, ModelProfile
from ferret_core.zoo import ZooModel, build_model

FAST = {"warmup": 0, "repeats": 1}


def _output_sizes(model: ZooModel) -> list[int]:
    x = torch.zeros(1, *model.input_shape)
    sizes = []
    with torch.no_grad():
        for unit in model.units:
            x = unit(x)
            sizes.append(x.numel())
    return sizes


@pytest.mark.parametrize(("name", "kwargs"), [("mnistnet", {}), ("convnet", {}), ("resnet18", {}), ("mlp", {})])
def test_one_layer_per_unit_with_direct_counts(name: str, kwargs: dict[str, int]) -> None:
    model = build_model(name, **kwargs)
    profile = profile_model(model, **FAST)
    assert isinstance(profile, ModelProfile)
    assert profile.model == name
    assert profile.input_shape == model.input_shape
    assert [layer.name for layer in profile.layers] == list(model.unit_names)
    assert [layer.params for layer in profile.layers] == [
        sum(p.numel() for p in unit.parameters()) for unit in model.units
    ]
    assert [layer.activations for layer in profile.layers] == _output_sizes(model)
    assert all(layer.t_f > 0 and layer.t_b > 0 for layer in profile.layers)
    assert all(layer.saved is not None and layer.saved > 0 for layer in profile.layers)


def test_mnistnet_golden_params_and_meta() -> None:
    profile = profile_model(build_model("mnistnet"), warmup=1, repeats=3)
    assert [layer.params for layer in profile.layers] == [320, 18496, 1179776, 1290]
    assert [layer.activations for layer in profile.layers] == [32 * 26 * 26, 64 * 12 * 12, 128, 10]
    meta = profile.meta
    assert meta["torch"] == torch.__version__
    assert meta["threads"] == torch.get_num_threads()
    assert (meta["warmup"], meta["repeats"], meta["batch_size"]) == (1, 3, 1)
    assert profile.device == "cpu" and profile.dtype == "float32" and profile.time_unit == "s"


def test_saved_tensors_are_counted_by_storage() -> None:
    # Linear keeps its input, ReLU its output; parameters are excluded (autograd, torch 2.13).
    profile = profile_model(build_model("mlp"), **FAST)
    assert [layer.saved for layer in profile.layers] == [784 + 256, 256 + 128, 128]
    # conv2+pool: input 32×26×26, ReLU output 64×24×24 (also max-pool's input: one storage),
    # int64 pool indices 64×12×12 (two float32 elements each).
    mnist = profile_model(build_model("mnistnet"), **FAST)
    assert mnist.layers[1].saved == 32 * 26 * 26 + 64 * 24 * 24 + 2 * 64 * 12 * 12


def test_sizes_are_per_sample_for_larger_batches() -> None:
    model = build_model("mlp")
    one = profile_model(model, **FAST)
    four = profile_model(model, batch_size=4, **FAST)
    assert [(lp.params, lp.activations, lp.saved) for lp in one.layers] == [
        (lp.params, lp.activations, lp.saved) for lp in four.layers
    ]
    assert four.meta["batch_size"] == 4


def _with_batchnorm() -> ZooModel:
    # A train-mode BatchNorm updates its running statistics on every forward: a profiler that ran
    # the caller's modules would change them.
    units = (
        nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Conv2d(8, 8, 3), nn.BatchNorm2d(8), nn.ReLU()),
        nn.Sequential(nn.Flatten(), nn.Linear(8 * 6 * 6, 3)),
    )
    return ZooModel("bn", units, (3, 10, 10), 3)


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("make", [_with_batchnorm, lambda: build_model("mobilenet", norm="batch-eval")])
def test_profiling_does_not_mutate_the_model(mode: str, make: Callable[[], ZooModel]) -> None:
    model = make()
    sequential = model.as_sequential()
    sequential.train(mode == "train")
    modes = [m.training for m in sequential.modules()]
    before = {k: v.clone() for k, v in sequential.state_dict().items()}
    rng = torch.get_rng_state()
    profile_model(model, warmup=1, repeats=2, batch_size=2)
    after = sequential.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in sequential.parameters())
    assert [m.training for m in sequential.modules()] == modes
    assert torch.equal(rng, torch.get_rng_state())


def test_profile_json_round_trip(tmp_path: Path) -> None:
    profile = profile_model(build_model("convnet"), **FAST)
    path = tmp_path / "convnet.json"
    profile.save(path)
    loaded = ModelProfile.load(path)
    assert loaded == profile
    assert loaded.meta == profile.meta
    assert all(isinstance(layer, LayerProfile) for layer in loaded.layers)


def test_first_unit_without_parameters_has_zero_backward() -> None:
    model = ZooModel("tiny", (nn.Flatten(), nn.Linear(4, 2)), (2, 2), 2)
    profile = profile_model(model, **FAST)
    assert profile.layers[0].t_b == 0.0 and profile.layers[0].params == 0
    assert profile.layers[1].t_b > 0


def test_float64_profile() -> None:
    profile = profile_model(build_model("mlp", in_features=54, num_classes=7), dtype="float64", **FAST)
    assert profile.dtype == "float64"
    assert profile.layers[0].saved == 54 + 256


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device"),
        ({"dtype": "int8"}, "dtype"),
        ({"repeats": 0}, "repeats"),
        ({"warmup": -1}, "warmup"),
        ({"batch_size": 0}, "batch_size"),
        ({"clock": "tsc"}, "clock"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        profile_model(build_model("mlp"), **kwargs)  # type: ignore[arg-type]


def test_clock_choice() -> None:
    model = build_model("mlp")
    assert profile_model(model, **FAST).meta["clock"] == "cpu"  # one thread (tests/conftest.py)
    assert profile_model(model, clock="wall", **FAST).meta["clock"] == "wall"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert profile_model(model, **FAST).meta["clock"] == "wall"
        with pytest.raises(ConfigError, match="one torch thread"):
            profile_model(model, clock="cpu", **FAST)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without CUDA")
def test_cuda_without_cuda_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="CUDA is not available"):
        profile_model(build_model("mlp"), device="cuda")


def test_a_failing_unit_names_itself() -> None:
    model = ZooModel("broken", (nn.Linear(4, 3), nn.Linear(5, 2)), (4,), 2)
    with pytest.raises(ProfileError, match=r"unit 1 \(unit1\)"):
        profile_model(model, **FAST)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "mobilenet"])
def test_224_models_profile(name: str) -> None:
    model = build_model(name, input_size=224, num_classes=1000)
    profile = profile_model(model, **FAST)
    assert profile.num_units == model.num_units
    assert profile.total_params == model.num_params
    assert profile.layers[0].activations == 64 * 56 * 56 if name == "resnet18" else 32 * 112 * 112


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_profile() -> None:
    model = build_model("convnet")
    profile = profile_model(model, device="cuda", **FAST)
    assert profile.device == "cuda" and profile.meta["clock"] == "cuda-event"
    assert all(layer.t_f > 0 for layer in profile.layers)
    assert all(p.device.type == "cpu" for p in model.as_sequential().parameters())


COMMITTED = Path(__file__).resolve().parents[2] / "benchmarks" / "profiles"


@pytest.mark.parametrize(
    ("stem", "name", "input_size"),
    [
        ("mlp", "mlp", None),
        ("mnistnet", "mnistnet", None),
        ("convnet", "convnet", None),
        ("resnet18-32", "resnet18", 32),
        ("resnet18-224", "resnet18", 224),
        ("mobilenet-32", "mobilenet", 32),
        ("mobilenet-224", "mobilenet", 224),
    ],
)
def test_committed_profiles_match_the_zoo(stem: str, name: str, input_size: int | None) -> None:
    profile = ModelProfile.load(COMMITTED / f"{stem}.json")
    model = build_model(name, input_size=input_size)
    assert profile.model == name and profile.input_shape == model.input_shape
    assert [layer.name for layer in profile.layers] == list(model.unit_names)
    assert [layer.params for layer in profile.layers] == [
        sum(p.numel() for p in unit.parameters()) for unit in model.units
    ]
    assert all(layer.t_f > 0 and layer.t_b > 0 for layer in profile.layers)
