"""The model zoo: shapes, exact parameter counts, units ≡ sequential, seeding, weights files."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from ferret_core.errors import ConfigError
from ferret_core.zoo import MODEL_NAMES, EvalBatchNorm2d, ZooModel, build_model, save_weights


def _chained(model: ZooModel, x: torch.Tensor) -> torch.Tensor:
    for unit in model.units:
        x = unit(x)
    return x


def _unit_params(model: ZooModel) -> list[int]:
    return [sum(p.numel() for p in unit.parameters()) for unit in model.units]


def _states_equal(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("batch", [1, 4])
def test_forward_in_train_mode_and_units_equal_sequential(name: str, batch: int) -> None:
    model = build_model(name)
    sequential = model.as_sequential().train()
    x = torch.randn(batch, *model.input_shape, generator=torch.Generator().manual_seed(1))
    out = sequential(x)
    assert out.shape == (batch, model.num_classes)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(_chained(model, x), out, rtol=0, atol=0)
    assert len(model.unit_names) == model.num_units
    assert model.num_params == sum(p.numel() for p in sequential.parameters())


def test_model_names_and_unknown_name() -> None:
    assert MODEL_NAMES == ("mlp", "mnistnet", "convnet", "resnet18", "mobilenet")
    with pytest.raises(ConfigError, match="mlp, mnistnet, convnet, resnet18, mobilenet"):
        build_model("vgg16")
    with pytest.raises(ValueError):  # ConfigError is a ValueError too
        build_model("ResNet18")


def test_mnistnet_units_are_the_golden_ones() -> None:
    model = build_model("mnistnet")
    assert model.input_shape == (1, 28, 28)
    assert _unit_params(model) == [320, 18496, 1179776, 1290]
    assert model.unit_names == ("conv1", "conv2+pool", "fc1", "fc2")
    assert not any(isinstance(m, nn.Dropout) for unit in model.units for m in unit.modules())


def test_mlp_inputs() -> None:
    mnist = build_model("mlp")
    assert mnist.input_shape == (784,)
    assert _unit_params(mnist) == [784 * 256 + 256, 256 * 128 + 128, 128 * 10 + 10]
    assert mnist.as_sequential()(torch.randn(2, 1, 28, 28)).shape == (2, 10)  # flattens images
    covertype = build_model("mlp", in_features=54, num_classes=7)
    assert covertype.input_shape == (54,)
    assert covertype.as_sequential()(torch.randn(3, 54)).shape == (3, 7)
    image = build_model("mlp", input_size=32, in_channels=3)
    assert image.input_shape == (3, 32, 32)
    assert _unit_params(image)[0] == 3072 * 256 + 256
    with pytest.raises(ConfigError, match="contradicts"):
        build_model("mlp", input_size=28, in_features=54)
    with pytest.raises(ConfigError, match="mlp only"):
        build_model("convnet", in_features=54)


def test_convnet_layout() -> None:
    model = build_model("convnet")
    assert model.input_shape == (3, 32, 32)
    assert _unit_params(model) == [896, 18496, 73856, 2048 * 256 + 256, 2570]
    tiny = build_model("convnet", input_size=64, num_classes=200)
    assert tiny.as_sequential()(torch.randn(1, 3, 64, 64)).shape == (1, 200)


def test_resnet18_parameter_counts() -> None:
    cifar = build_model("resnet18")
    assert cifar.num_units == 10
    assert cifar.unit_names[0] == "stem" and cifar.unit_names[-1] == "head"
    assert cifar.num_params == 11_173_962  # CIFAR stem, 10 classes (≈11.2M)
    assert build_model("resnet18", num_classes=1000).num_params == 11_681_832


@pytest.mark.slow
def test_resnet18_imagenet_matches_torchvision_count() -> None:
    model = build_model("resnet18", num_classes=1000, input_size=224)
    assert model.num_params == 11_689_512  # torchvision.models.resnet18
    assert model.input_shape == (3, 224, 224)
    with torch.no_grad():
        assert model.as_sequential()(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_mobilenet_v1_parameter_counts() -> None:
    model = build_model("mobilenet", num_classes=1000)
    assert model.num_units == 15  # stem, 13 depthwise-separable blocks, head
    assert model.num_params == 4_231_976  # MobileNet v1 1.0 (Howard et al.), trainable parameters
    assert build_model("mobilenet", num_classes=1000, input_size=224).num_params == 4_231_976


@pytest.mark.slow
def test_mobilenet_224_forward() -> None:
    model = build_model("mobilenet", input_size=224)
    with torch.no_grad():
        hidden = _chained(ZooModel("stem", model.units[:-1], model.input_shape, 10), torch.randn(1, 3, 224, 224))
    assert hidden.shape == (1, 1024, 7, 7)


def test_group_norm_by_default_and_batch_eval_stays_in_eval() -> None:
    group = build_model("resnet18")
    norms = [m for u in group.units for m in u.modules() if isinstance(m, nn.GroupNorm)]
    assert norms and all(m.num_groups == 32 for m in norms)
    assert not any(isinstance(m, nn.BatchNorm2d) for u in group.units for m in u.modules())

    model = build_model("mobilenet", norm="batch-eval")
    sequential = model.as_sequential().train()
    bns = [m for m in sequential.modules() if isinstance(m, EvalBatchNorm2d)]
    assert bns and not any(m.training for m in bns)
    before = {k: v.clone() for k, v in sequential.state_dict().items()}
    sequential(torch.randn(1, *model.input_shape))  # batch 1 in "train" mode works
    assert all(torch.equal(before[k], v) for k, v in sequential.state_dict().items())
    with pytest.raises(ConfigError, match="group, batch-eval"):
        build_model("resnet18", norm="batch")


def test_seeds_are_reproducible_and_leave_the_global_rng_alone() -> None:
    rng = torch.get_rng_state()
    a = build_model("convnet", seed=3).as_sequential()
    b = build_model("convnet", seed=3).as_sequential()
    c = build_model("convnet", seed=4).as_sequential()
    assert torch.equal(rng, torch.get_rng_state())
    assert _states_equal(a, b)
    assert not _states_equal(a, c)
    assert _states_equal(
        build_model("resnet18", seed=7).as_sequential(), build_model("resnet18", seed=7).as_sequential()
    )


def test_weights_round_trip(tmp_path: Path) -> None:
    source = build_model("mnistnet", seed=1)
    path = tmp_path / "mnistnet.pt"
    save_weights(source, path)
    loaded = build_model("mnistnet", seed=2, weights=path)
    assert _states_equal(source.as_sequential(), loaded.as_sequential())
    bn_source = build_model("resnet18", norm="batch-eval", seed=5)
    save_weights(bn_source, tmp_path / "r.pt")
    bn_loaded = build_model("resnet18", norm="batch-eval", weights=str(tmp_path / "r.pt"))
    assert _states_equal(bn_source.as_sequential(), bn_loaded.as_sequential())


def test_weights_mismatch_errors(tmp_path: Path) -> None:
    path = tmp_path / "mnistnet.pt"
    save_weights(build_model("mnistnet"), path)
    with pytest.raises(ConfigError, match=r"missing keys.*unexpected keys"):
        build_model("convnet", weights=path)
    with pytest.raises(ConfigError, match=r"3\.0\.weight: expected \(7, 128\), got \(10, 128\)"):
        build_model("mnistnet", num_classes=7, weights=path)
    with pytest.raises(ConfigError, match="does not exist"):
        build_model("mnistnet", weights=tmp_path / "absent.pt")
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ConfigError, match="state dict"):
        build_model("mnistnet", weights=tmp_path / "list.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="cannot be read"):
        build_model("mnistnet", weights=tmp_path / "junk.pt")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_classes": 0}, "num_classes"),
        ({"input_size": -1}, "input_size"),
        ({"input_size": 4}, "too small"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_model("mnistnet", **kwargs)  # type: ignore[arg-type]


def test_zoo_model_validates_names() -> None:
    unit = nn.Linear(2, 2)
    assert ZooModel("m", (unit,), (2,), 2).unit_names == ("unit0",)
    with pytest.raises(ConfigError):
        ZooModel("m", (unit,), (2,), 2, unit_names=("a", "b"))
    with pytest.raises(ConfigError):
        ZooModel("m", (), (2,), 2)
