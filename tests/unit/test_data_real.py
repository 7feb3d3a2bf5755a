"""The real datasets of ../shared/data: MNIST, Fashion-MNIST, split-MNIST and a few CIFAR-10 JPEGs.

Skipped (with the reason) where that folder is missing. The full CIFAR-10 decode is not run here: the
tar reader is tested on a generated archive in test_data_cifar10.py.
"""

from __future__ import annotations

import itertools
import tarfile
from pathlib import Path

import numpy as np
import pytest

from ferret_core.data import Dataset, iter_stream, load_dataset
from ferret_core.data.cifar10_jpeg import ARCHIVE, CLASSES, _member_key
from ferret_core.data.images import decode_image
from ferret_core.data.splits import split_by_class

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"

needs_data = pytest.mark.skipif(
    not (DATA / "MNIST" / "raw").is_dir(),
    reason=f"real datasets not found at {DATA} (the team's shared data folder, see data/README.md)",
)


@pytest.fixture(scope="module")
def mnist() -> Dataset:
    return load_dataset("mnist", DATA)


@needs_data
def test_mnist_shapes_labels_and_order(mnist: Dataset) -> None:
    assert mnist.x_train.shape == (60000, 1, 28, 28) and mnist.x_test.shape == (10000, 1, 28, 28)
    assert mnist.x_train.dtype == np.uint8
    assert mnist.y_train[:5].tolist() == [5, 0, 4, 1, 9]
    assert set(np.unique(mnist.y_train)) == set(range(10)) == set(np.unique(mnist.y_test))
    first = next(iter_stream(mnist))
    assert first.y == 5 and first.x.shape == (1, 28, 28) and float(first.x.max()) == 1.0


@needs_data
def test_split_mnist_has_five_tasks_of_two_classes_in_order(mnist: Dataset) -> None:
    split = split_by_class(mnist)
    assert split.name == "split-mnist" and split.num_tasks == 5
    assert split.tasks_train is not None and split.tasks_test is not None
    assert np.all(np.diff(split.tasks_train) >= 0) and np.all(np.diff(split.tasks_test) >= 0)
    for task in range(5):
        assert sorted(set(split.y_train[split.tasks_train == task].tolist())) == [2 * task, 2 * task + 1]
        assert sorted(set(split.y_test[split.tasks_test == task].tolist())) == [2 * task, 2 * task + 1]
    assert len(split.y_train) == 60000
    stream = [(item.y, item.task) for item in itertools.islice(iter_stream(split), 3)]
    assert stream == [(0, 0), (1, 0), (1, 0)]


@needs_data
def test_fashion_mnist() -> None:
    ds = load_dataset("fashion-mnist", DATA)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert set(np.unique(ds.y_train)) == set(range(10))
    assert np.bincount(ds.y_test).tolist() == [1000] * 10


@pytest.mark.skipif(not (DATA / ARCHIVE).is_file(), reason=f"{DATA / ARCHIVE} not found")
def test_real_cifar10_tar_members_decode() -> None:
    decoded = []
    with tarfile.open(DATA / ARCHIVE, "r|gz") as archive:
        for member in archive:
            key = _member_key(member.name) if member.isfile() else None
            if key is None:
                continue
            handle = archive.extractfile(member)
            assert handle is not None
            decoded.append((key, decode_image(handle.read(), (32, 32))))
            if len(decoded) == 5:
                break
    assert len(decoded) == 5
    for (split, name, file), image in decoded:
        assert split in ("train", "test") and name in CLASSES and file.endswith(".jpg")
        assert image.shape == (3, 32, 32) and image.dtype == np.uint8
        assert 20 < float(image.mean()) < 235  # a real picture, not a blank
