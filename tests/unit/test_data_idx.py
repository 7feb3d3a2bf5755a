"""IDX readers (MNIST, Fashion-MNIST, EMNIST) on generated files in torchvision's layout."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from ferret_core.data import load_dataset
from ferret_core.data.idx import MNIST_MD5, parse_idx, read_idx
from ferret_core.errors import DataError


def idx_bytes(array: np.ndarray) -> bytes:
    """A reference IDX encoder (uint8 only): magic 0x0000 08 rank, big-endian sizes, data."""
    assert array.dtype == np.uint8
    return (
        struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape) + (array.tobytes())
    )


def write_idx(path: Path, array: np.ndarray, *, compress: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = idx_bytes(array)
    if compress:
        with gzip.open(path.with_name(path.name + ".gz"), "wb") as handle:
            handle.write(raw)
    else:
        path.write_bytes(raw)


def write_mnist_like(
    folder: Path,
    prefix: str,
    splits: tuple[str, str],
    n: tuple[int, int],
    classes: int,
    *,
    compress: bool = True,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    arrays: dict[str, np.ndarray] = {}
    for split, count in zip(splits, n, strict=True):
        images = rng.integers(0, 256, (count, 28, 28)).astype(np.uint8)
        labels = rng.integers(0, classes, count).astype(np.uint8)
        write_idx(folder / f"{prefix}{split}-images-idx3-ubyte", images, compress=compress)
        write_idx(folder / f"{prefix}{split}-labels-idx1-ubyte", labels, compress=compress)
        arrays[f"x_{split}"], arrays[f"y_{split}"] = images, labels
    return arrays


def test_parse_idx_round_trips_and_checks_headers() -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(parse_idx(idx_bytes(array)), array)
    big_endian = struct.pack(">BBBB", 0, 0, 0x0C, 1) + struct.pack(">I", 2) + struct.pack(">ii", -1, 7)
    assert parse_idx(big_endian).tolist() == [-1, 7]
    with pytest.raises(DataError, match="not an IDX file"):
        parse_idx(b"\x1f\x8b\x08\x00junk")
    with pytest.raises(DataError, match="not an IDX file"):
        parse_idx(b"")
    with pytest.raises(DataError, match="IDX header says shape"):
        parse_idx(idx_bytes(array)[:-1])


def test_read_idx_checks_md5_of_uncompressed_content(tmp_path: Path) -> None:
    array = np.ones((2, 2), dtype=np.uint8)
    write_idx(tmp_path / "a", array)
    good = hashlib.md5(idx_bytes(array)).hexdigest()
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz", good), array)
    with pytest.raises(DataError, match="does not match the published"):
        read_idx(tmp_path / "a.gz", "0" * 32)
    (tmp_path / "broken.gz").write_bytes(b"not gzip at all")
    with pytest.raises(DataError, match="cannot read"):
        read_idx(tmp_path / "broken.gz")


def test_fashion_mnist_layout(tmp_path: Path) -> None:
    arrays = write_mnist_like(tmp_path / "FashionMNIST" / "raw", "", ("train", "t10k"), (12, 5), 10)
    ds = load_dataset("fashion-mnist", tmp_path)
    assert ds.name == "fashion-mnist" and ds.input_shape == (1, 28, 28) and ds.x_train.dtype == np.uint8
    np.testing.assert_array_equal(ds.x_train[:, 0], arrays["x_train"])
    np.testing.assert_array_equal(ds.y_test, arrays["y_t10k"])
    assert ds.x_train.flags.writeable


def test_uncompressed_files_are_read_too(tmp_path: Path) -> None:
    arrays = write_mnist_like(tmp_path / "FashionMNIST" / "raw", "", ("train", "t10k"), (4, 3), 10, compress=False)
    np.testing.assert_array_equal(load_dataset("fashion-mnist", tmp_path).y_train, arrays["y_train"])


def test_mnist_rejects_content_that_is_not_mnist(tmp_path: Path) -> None:
    write_mnist_like(tmp_path / "MNIST" / "raw", "", ("train", "t10k"), (4, 3), 10)
    with pytest.raises(DataError, match="does not match the published") as info:
        load_dataset("mnist", tmp_path)
    assert MNIST_MD5["train-images-idx3-ubyte"] in str(info.value)


def test_emnist_balanced_is_transposed_back(tmp_path: Path) -> None:
    arrays = write_mnist_like(tmp_path / "EMNIST" / "raw", "emnist-balanced-", ("train", "test"), (9, 4), 47)
    ds = load_dataset("emnist", tmp_path)
    assert ds.name == "emnist" and ds.num_classes == 47
    np.testing.assert_array_equal(ds.x_train[:, 0], arrays["x_train"].transpose(0, 2, 1))
    np.testing.assert_array_equal(ds.y_train, arrays["y_train"])


def test_emnist_gzip_subfolder_as_the_zip_unpacks(tmp_path: Path) -> None:
    arrays = write_mnist_like(tmp_path / "EMNIST" / "gzip", "emnist-balanced-", ("train", "test"), (3, 2), 47)
    np.testing.assert_array_equal(load_dataset("emnist", tmp_path).y_test, arrays["y_test"])


def test_labels_out_of_range_and_mismatched_counts(tmp_path: Path) -> None:
    folder = tmp_path / "FashionMNIST" / "raw"
    write_mnist_like(folder, "", ("train", "t10k"), (4, 3), 10)
    write_idx(folder / "train-labels-idx1-ubyte", np.array([0, 1, 2, 12], dtype=np.uint8))
    with pytest.raises(DataError, match=r"must lie in \[0, 10\)"):
        load_dataset("fashion-mnist", tmp_path)
    write_idx(folder / "train-labels-idx1-ubyte", np.array([0, 1], dtype=np.uint8))
    with pytest.raises(DataError, match="N labels"):
        load_dataset("fashion-mnist", tmp_path)


def test_missing_files_are_all_named_with_the_root(tmp_path: Path) -> None:
    folder = tmp_path / "FashionMNIST" / "raw"
    write_mnist_like(folder, "", ("train", "t10k"), (4, 3), 10)
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    (folder / "train-images-idx3-ubyte.gz").unlink()
    with pytest.raises(DataError) as info:
        load_dataset("split-fashion-mnist", tmp_path)
    message = str(info.value)
    assert "t10k-labels-idx1-ubyte" in message and "train-images-idx3-ubyte" in message
    assert "train-labels-idx1-ubyte" not in message
    assert str(folder) in message and f"data root {tmp_path}" in message
