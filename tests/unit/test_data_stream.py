"""Dataset contract, the stream, splits and the registry (no data files needed: digits + synthetic)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ferret_core.data import DATASET_NAMES, Dataset, StreamItem, iter_stream, load_dataset, normalise
from ferret_core.data import test_split as held_out
from ferret_core.data.splits import class_to_task, split_by_class
from ferret_core.errors import ConfigError, DataError


def _toy(n_train: int = 20, n_test: int = 10, classes: int = 10, dtype: type = np.uint8) -> Dataset:
    rng = np.random.default_rng(0)
    x_tr: np.ndarray = rng.integers(0, 256, (n_train, 1, 2, 2)).astype(dtype)
    x_te: np.ndarray = rng.integers(0, 256, (n_test, 1, 2, 2)).astype(dtype)
    return Dataset(
        "toy",
        x_tr,
        rng.integers(0, classes, n_train).astype(np.int64),
        x_te,
        rng.integers(0, classes, n_test).astype(np.int64),
        num_classes=classes,
        input_shape=(1, 2, 2),
    )


@pytest.fixture(scope="module")
def digits() -> Dataset:
    return load_dataset("digits", None)


def test_digits_shapes_and_split(digits: Dataset) -> None:
    assert digits.name == "digits" and digits.num_classes == 10 and digits.input_shape == (1, 8, 8)
    assert len(digits.y_train) + len(digits.y_test) == 1797
    assert len(digits.y_test) == 359
    assert digits.x_train.dtype == np.float32
    assert digits.x_train.min() >= 0.0 and digits.x_train.max() <= 1.0
    assert set(np.unique(digits.y_train)) == set(range(10))
    assert digits.tasks_train is None and digits.num_tasks == 1


def test_digits_is_deterministic_per_seed(digits: Dataset) -> None:
    again = load_dataset("digits", "/nonexistent/root/is/ignored", seed=0)
    np.testing.assert_array_equal(again.y_train, digits.y_train)
    np.testing.assert_array_equal(again.x_test, digits.x_test)
    other = load_dataset("digits", None, seed=1)
    assert not np.array_equal(other.y_train, digits.y_train)


def test_digits_stream_is_deterministic(digits: Dataset) -> None:
    first = list(iter_stream(digits, limit=50))
    second = list(iter_stream(digits, limit=50))
    assert [item.index for item in first] == list(range(50))
    assert [item.y for item in first] == digits.y_train[:50].tolist()
    for a, b in zip(first, second, strict=True):
        assert isinstance(a, StreamItem)
        assert a.x.dtype == torch.float32 and a.x.shape == (1, 8, 8)
        torch.testing.assert_close(a.x, b.x)
        assert a.y == b.y and a.task == 0 and isinstance(a.y, int)
    assert len(list(iter_stream(digits))) == len(digits.y_train)


def test_iid_stream_is_a_seeded_permutation(digits: Dataset) -> None:
    plain = [item.y for item in iter_stream(digits)]
    shuffled = [item.y for item in iter_stream(digits, iid=True, seed=3)]
    assert shuffled != plain and sorted(shuffled) == sorted(plain)
    assert shuffled == [item.y for item in iter_stream(digits, iid=True, seed=3)]
    assert shuffled != [item.y for item in iter_stream(digits, iid=True, seed=4)]


def test_stream_items_do_not_alias_the_dataset(digits: Dataset) -> None:
    item = next(iter_stream(digits))
    item.x.fill_(7.0)
    assert digits.x_train.max() <= 1.0


def test_test_split_tensors(digits: Dataset) -> None:
    x, y = held_out(digits)
    assert x.dtype == torch.float32 and x.shape == (359, 1, 8, 8)
    assert y.dtype == torch.int64 and y.tolist() == digits.y_test.tolist()


def test_uint8_is_scaled_to_unit_interval() -> None:
    ds = _toy()
    x, _ = held_out(ds)
    torch.testing.assert_close(x, torch.from_numpy(ds.x_test.astype(np.float32) / 255.0))
    first = next(iter_stream(ds))
    torch.testing.assert_close(first.x, torch.from_numpy(ds.x_train[0].astype(np.float32) / 255.0))
    with pytest.raises(DataError, match="uint8 or float32"):
        normalise(np.zeros(3, dtype=np.int16))


def test_limit_and_bad_limit() -> None:
    ds = _toy()
    assert len(list(iter_stream(ds, limit=5))) == 5
    assert list(iter_stream(ds, limit=0)) == []
    with pytest.raises(ConfigError, match="limit"):
        list(iter_stream(ds, limit=-1))


def test_dataset_validates_its_arrays() -> None:
    ds = _toy()
    with pytest.raises(DataError, match="shape"):
        Dataset("bad", ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10, (1, 3, 3))
    with pytest.raises(DataError, match=r"must lie in \[0, 3\)"):
        Dataset("bad", ds.x_train, ds.y_train, ds.x_test, ds.y_test, 3, (1, 2, 2))
    with pytest.raises(DataError, match="uint8 or float32"):
        Dataset("bad", ds.x_train.astype(np.float64), ds.y_train, ds.x_test, ds.y_test, 10, (1, 2, 2))
    with pytest.raises(DataError, match="int64"):
        Dataset("bad", ds.x_train, ds.y_train.astype(np.int32), ds.x_test, ds.y_test, 10, (1, 2, 2))
    with pytest.raises(DataError, match="tasks_train"):
        Dataset("bad", ds.x_train, ds.y_train, ds.x_test, ds.y_test, 10, (1, 2, 2), np.zeros(3, np.int64))


def test_class_to_task_groups() -> None:
    assert class_to_task(10).tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert class_to_task(7).tolist() == [0, 0, 1, 1, 2, 3, 4]
    assert np.bincount(class_to_task(100)).tolist() == [20] * 5
    with pytest.raises(ConfigError, match="at least 5 classes"):
        class_to_task(3)


@given(st.integers(5, 60), st.integers(0, 2**16))
def test_split_orders_task_by_task_and_keeps_every_item(classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 40
    ds = Dataset(
        "toy",
        rng.integers(0, 255, (n, 1, 2, 2)).astype(np.uint8),
        rng.integers(0, classes, n).astype(np.int64),
        np.zeros((0, 1, 2, 2), np.uint8),
        np.zeros(0, np.int64),
        num_classes=classes,
        input_shape=(1, 2, 2),
    )
    split = split_by_class(ds)
    assert split.tasks_train is not None and split.tasks_test is not None
    assert np.all(np.diff(split.tasks_train) >= 0)
    np.testing.assert_array_equal(split.tasks_train, class_to_task(classes)[split.y_train])
    assert sorted(split.y_train.tolist()) == sorted(ds.y_train.tolist())
    for task in range(5):  # stable: the base order survives inside a task
        base = ds.y_train[class_to_task(classes)[ds.y_train] == task]
        np.testing.assert_array_equal(split.y_train[split.tasks_train == task], base)


def test_split_digits_through_the_registry(digits: Dataset) -> None:
    split = load_dataset("split-digits", None)
    assert split.name == "split-digits" and split.num_tasks == 5
    assert split.tasks_train is not None and split.tasks_test is not None
    assert [sorted(set(split.y_train[split.tasks_train == t].tolist())) for t in range(5)] == [
        [0, 1],
        [2, 3],
        [4, 5],
        [6, 7],
        [8, 9],
    ]
    assert np.all(np.diff(split.tasks_test) >= 0)
    tasks = [item.task for item in iter_stream(split)]
    assert tasks == sorted(tasks) and set(tasks) == set(range(5))


def test_dataset_names_follow_design() -> None:
    base = [
        "digits",
        "mnist",
        "fashion-mnist",
        "emnist",
        "cifar10",
        "cifar100",
        "svhn",
        "tiny-imagenet",
        "core50",
        "core50-iid",
        "covertype",
        "clear10",
        "clear100",
    ]
    assert set(base) <= set(DATASET_NAMES)
    assert {f"split-{name}" for name in base} <= set(DATASET_NAMES)
    assert len(DATASET_NAMES) == len(set(DATASET_NAMES))


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'imagenet'") as info:
        load_dataset("imagenet", "/data")
    assert "mnist" in str(info.value) and "split-cifar10" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_file_datasets_need_a_root() -> None:
    with pytest.raises(ConfigError, match="data root"):
        load_dataset("mnist", None)


@pytest.mark.parametrize("name", [n for n in DATASET_NAMES if n not in ("digits", "split-digits")])
def test_every_file_dataset_reports_missing_files(name: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError) as info:
        load_dataset(name, tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and "expected" in message
    assert isinstance(info.value, FileNotFoundError)
