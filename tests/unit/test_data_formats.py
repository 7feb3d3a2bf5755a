"""CIFAR-100 (pickles), SVHN (.mat) and Covertype (CSV) on small generated files in their layouts."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import scipy.io  # type: ignore[import-untyped]

from ferret_core.data import load_dataset
from ferret_core.data.cifar100 import load_pickle
from ferret_core.errors import DataError

# --- CIFAR-100 -------------------------------------------------------------------------------------


def _cifar100_batch(n: int, seed: int) -> dict[bytes, object]:
    rng = np.random.default_rng(seed)
    return {
        b"filenames": [f"img{i}.png".encode() for i in range(n)],
        b"data": rng.integers(0, 256, (n, 3072)).astype(np.uint8),
        b"fine_labels": rng.integers(0, 100, n).tolist(),
        b"coarse_labels": rng.integers(0, 20, n).tolist(),
    }


def test_cifar100_extracted_folder(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    train, test = _cifar100_batch(6, 0), _cifar100_batch(4, 1)
    (folder / "train").write_bytes(pickle.dumps(train, protocol=2))
    (folder / "test").write_bytes(pickle.dumps(test, protocol=5))
    ds = load_dataset("cifar100", tmp_path)
    assert ds.num_classes == 100 and ds.input_shape == (3, 32, 32) and ds.x_train.dtype == np.uint8
    np.testing.assert_array_equal(ds.x_train, np.asarray(train[b"data"]).reshape(6, 3, 32, 32))
    assert ds.y_test.tolist() == test[b"fine_labels"]


def test_cifar100_read_inside_the_archive(tmp_path: Path) -> None:
    batches = {"train": _cifar100_batch(5, 2), "test": _cifar100_batch(3, 3)}
    with tarfile.open(tmp_path / "cifar-100-python.tar.gz", "w:gz") as archive:
        for split, batch in batches.items():
            raw = pickle.dumps(batch)
            info = tarfile.TarInfo(f"cifar-100-python/{split}")
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    ds = load_dataset("split-cifar100", tmp_path)
    assert sorted(ds.y_train.tolist()) == sorted(batches["train"][b"fine_labels"])  # type: ignore[call-overload]
    assert ds.tasks_train is not None
    np.testing.assert_array_equal(ds.tasks_train, ds.y_train // 20)


class _Exploit:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("pwned",))


def test_cifar100_pickle_cannot_run_code(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"refusing to load builtins\.print"):
        load_pickle(pickle.dumps({b"data": _Exploit()}), "evil")
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    (folder / "train").write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8)}))
    with pytest.raises(DataError, match="fine_labels"):
        load_dataset("cifar100", tmp_path)


# --- SVHN ------------------------------------------------------------------------------------------


def _write_svhn(path: Path, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (32, 32, 3, n)).astype(np.uint8)
    y = rng.integers(1, 11, (n, 1)).astype(np.uint8)  # 10 means the digit 0
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(str(path), {"X": x, "y": y})
    return x, y


@pytest.mark.parametrize("sub", ["SVHN", "."])
def test_svhn_mat_files(tmp_path: Path, sub: str) -> None:
    x, y = _write_svhn(tmp_path / sub / "train_32x32.mat", 7, 0)
    _write_svhn(tmp_path / sub / "test_32x32.mat", 3, 1)
    ds = load_dataset("svhn", tmp_path)
    assert ds.x_train.shape == (7, 3, 32, 32) and ds.num_classes == 10
    np.testing.assert_array_equal(ds.x_train[2], x[:, :, :, 2].transpose(2, 0, 1))
    assert ds.y_train.tolist() == [0 if v == 10 else int(v) for v in y[:, 0]]


def test_svhn_malformed(tmp_path: Path) -> None:
    scipy.io.savemat(str(tmp_path / "train_32x32.mat"), {"X": np.zeros((4, 4), np.uint8), "y": np.zeros(1)})
    _write_svhn(tmp_path / "test_32x32.mat", 2, 0)
    with pytest.raises(DataError, match=r"expected X \(32, 32, 3, N\)"):
        load_dataset("svhn", tmp_path)


# --- Covertype -------------------------------------------------------------------------------------


def _write_covtype(path: Path, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    table = np.concatenate(
        [rng.integers(0, 4000, (n, 10)), rng.integers(0, 2, (n, 44)), rng.integers(1, 8, (n, 1))], axis=1
    )
    text = "\n".join(",".join(str(v) for v in row) for row in table) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return table


@pytest.mark.parametrize("name", ["covtype.data.gz", "covtype.data", "covertype/covtype.data.gz"])
def test_covertype_csv(tmp_path: Path, name: str) -> None:
    table = _write_covtype(tmp_path / name, 50)
    ds = load_dataset("covertype", tmp_path, seed=0)
    assert ds.input_shape == (54,) and ds.num_classes == 7 and ds.x_train.dtype == np.float32
    assert len(ds.y_train) == 40 and len(ds.y_test) == 10
    assert float(ds.x_train.min()) == 0.0 and float(ds.x_train.max()) == 1.0
    assert sorted(np.concatenate([ds.y_train, ds.y_test]).tolist()) == sorted((table[:, -1] - 1).tolist())
    other = load_dataset("covertype", tmp_path, seed=1)
    assert not np.array_equal(other.y_train, ds.y_train)
    split = load_dataset("split-covertype", tmp_path)
    assert split.tasks_train is not None and split.num_tasks == 5


def test_covertype_malformed(tmp_path: Path) -> None:
    (tmp_path / "covtype.data").write_text("1,2,3\n4,5,6\n")
    with pytest.raises(DataError, match="expected 55 columns"):
        load_dataset("covertype", tmp_path)
    table = _write_covtype(tmp_path / "covtype.data", 5)
    table[0, -1] = 9
    (tmp_path / "covtype.data").write_text("\n".join(",".join(map(str, r)) for r in table))
    with pytest.raises(DataError, match="class column"):
        load_dataset("covertype", tmp_path)
