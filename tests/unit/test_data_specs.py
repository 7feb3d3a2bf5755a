"""DATASET_SPECS agrees with what the loaders return (for the datasets available here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ferret_core.data import DATASET_SPECS, dataset_spec, load_dataset
from ferret_core.errors import ConfigError

DATA_ROOT = Path(__file__).resolve().parents[3] / "shared" / "data"


@pytest.mark.parametrize("name", ["digits", "mnist", "fashion-mnist", "split-mnist"])
def test_spec_matches_loader(name: str) -> None:
    if name != "digits" and not (DATA_ROOT / "MNIST").is_dir():
        pytest.skip(f"no data root at {DATA_ROOT}")
    ds = load_dataset(name, DATA_ROOT if name != "digits" else None)
    assert dataset_spec(name) == (ds.input_shape, ds.num_classes)


def test_every_base_name_has_a_spec_and_unknown_names_fail() -> None:
    assert dataset_spec("split-cifar10") == DATASET_SPECS["cifar10"]
    with pytest.raises(ConfigError, match="unknown dataset"):
        dataset_spec("imagenet-22k")
