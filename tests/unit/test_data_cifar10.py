"""The CIFAR-10 (JPEG q75) reader on a small generated archive with the real layout, and its cache."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ferret_core.data.cifar10_jpeg as cifar10_jpeg
from ferret_core.data import load_dataset
from ferret_core.data.cifar10_jpeg import ARCHIVE, CLASSES, FOLDER
from ferret_core.errors import DataError

PER_CLASS = {"train": 3, "test": 1}


def _jpeg(colour: tuple[int, int, int]) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (32, 32), colour).save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def _colour(label: int, index: int) -> tuple[int, int, int]:
    return (20 * label + 10, 40 * index + 20, 200)


def _members(classes: tuple[str, ...] = CLASSES) -> dict[str, bytes]:
    members = {"README.md": b"# CIFAR-10 JPEG\n"}
    for split, count in PER_CLASS.items():
        for label, name in enumerate(classes):
            for index in range(count):
                members[f"{split}/{name}/{index:04d}.jpg"] = _jpeg(_colour(label, index))
    return members


def write_tar(path: Path, members: dict[str, bytes], *, reverse: bool = False) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name in sorted(members, reverse=reverse):
            info = tarfile.TarInfo(name)
            info.size = len(members[name])
            archive.addfile(info, io.BytesIO(members[name]))
    return path


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    write_tar(tmp_path / ARCHIVE, _members(), reverse=True)  # member order must not matter
    return tmp_path


def _check(ds_labels: np.ndarray, ds_x: np.ndarray, count: int) -> None:
    assert np.bincount(ds_labels, minlength=10).tolist() == [count] * 10
    for label, image in zip(ds_labels, ds_x, strict=True):  # each pixel colour encodes its class
        assert abs(int(image[0].mean()) - (20 * int(label) + 10)) <= 3


def test_reads_the_tar_layout_with_standard_labels(root: Path) -> None:
    ds = load_dataset("cifar10", root)
    assert ds.name == "cifar10" and ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    assert ds.x_train.dtype == np.uint8 and ds.x_train.shape == (30, 3, 32, 32)
    _check(ds.y_train, ds.x_train, 3)
    _check(ds.y_test, ds.x_test, 1)


def test_shuffled_with_the_seed(root: Path) -> None:
    a = load_dataset("cifar10", root, seed=0)
    b = load_dataset("cifar10", root, seed=0)
    c = load_dataset("cifar10", root, seed=1)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.y_train, c.y_train)
    assert a.y_train.tolist() != sorted(a.y_train.tolist())  # not grouped by class any more


def test_cache_is_written_once_and_reused(root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    first = load_dataset("cifar10", root, cache_dir=cache, seed=2)
    entries = list(cache.glob("cifar10-jpeg-q75-*.npz"))
    assert len(entries) == 1

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(cifar10_jpeg, "read_cifar10_tar", no_decoding)
    again = load_dataset("cifar10", root, cache_dir=cache, seed=2)
    np.testing.assert_array_equal(first.x_train, again.x_train)
    np.testing.assert_array_equal(first.y_test, again.y_test)
    assert list(cache.glob("*.npz")) == entries and not list(cache.glob(".*tmp"))


def test_corrupt_cache_is_rebuilt(root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    expected = load_dataset("cifar10", root, cache_dir=cache)
    (entry,) = cache.glob("*.npz")
    entry.write_bytes(b"garbage")
    np.testing.assert_array_equal(load_dataset("cifar10", root, cache_dir=cache).x_train, expected.x_train)


def test_extracted_folder_is_read_too(tmp_path: Path) -> None:
    for name, data in _members().items():
        path = tmp_path / FOLDER / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    ds = load_dataset("split-cifar10", tmp_path)
    _check(ds.y_train, ds.x_train, 3)
    assert ds.tasks_train is not None and ds.tasks_train.tolist() == sorted(ds.tasks_train.tolist())


def test_wrong_class_folders_are_reported(tmp_path: Path) -> None:
    classes = (*CLASSES[:9], "zebra")
    write_tar(tmp_path / ARCHIVE, _members(classes))
    with pytest.raises(DataError, match="10 CIFAR-10 classes"):
        load_dataset("cifar10", tmp_path)


def test_broken_archive_and_broken_jpeg(tmp_path: Path) -> None:
    (tmp_path / ARCHIVE).write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    with pytest.raises(DataError, match="cannot read the CIFAR-10 archive"):
        load_dataset("cifar10", tmp_path)
    members = _members()
    members["train/cat/0001.jpg"] = b"not a jpeg"
    write_tar(tmp_path / ARCHIVE, members)
    with pytest.raises(DataError, match=r"cannot decode image .*train/cat/0001\.jpg"):
        load_dataset("cifar10", tmp_path)


def test_missing_archive_names_file_and_root(tmp_path: Path) -> None:
    with pytest.raises(DataError) as info:
        load_dataset("cifar10", tmp_path)
    assert ARCHIVE in str(info.value) and str(tmp_path) in str(info.value)


def test_progress_reports_decoded_images_and_nothing_from_the_cache(root: Path, tmp_path: Path) -> None:
    calls: list[tuple[int, int | None]] = []
    load_dataset("cifar10", root, cache_dir=tmp_path / "c", progress=lambda done, total: calls.append((done, total)))
    assert calls == [(i, None) for i in range(1, 41)]
    calls.clear()
    load_dataset("cifar10", root, cache_dir=tmp_path / "c", progress=lambda done, total: calls.append((done, total)))
    assert calls == []
