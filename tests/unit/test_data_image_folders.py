"""Tiny-ImageNet, CORe50 (+ iid) and CLEAR on small generated image folders in their layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from ferret_core.data import iter_stream, load_dataset
from ferret_core.data.image_folders import CORE50_TEST_SESSIONS, CORE50_TRAIN_SESSIONS
from ferret_core.errors import DataError


def _image(path: Path, size: int, red: int, fmt: str = "PNG") -> None:
    """A flat image whose red channel encodes a label (survives resizing and JPEG)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (size, size), (red, 128, 64)).save(path, format=fmt)


def _red(x: np.ndarray) -> np.ndarray:
    red: np.ndarray = x[:, 0].reshape(len(x), -1).mean(axis=1)
    return red


# --- Tiny-ImageNet ---------------------------------------------------------------------------------

WNIDS = ["n01443537", "n01629819", "n01641577"]


def _tiny(root: Path, per_class: int = 2) -> None:
    base = root / "tiny-imagenet-200"
    lines = []
    for label, wnid in enumerate(WNIDS):
        for i in range(per_class):
            _image(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", 64, 40 * label + 20, "JPEG")
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
        name = f"val_{label}.JPEG"
        _image(base / "val" / "images" / name, 64, 40 * label + 20, "JPEG")
        lines.append(f"{name}\t{wnid}\t0\t0\t63\t63")
    (base / "val" / "val_annotations.txt").write_text("\n".join(reversed(lines)) + "\n")
    (base / "wnids.txt").write_text("\n".join(WNIDS) + "\n")


def test_tiny_imagenet_layout(tmp_path: Path) -> None:
    _tiny(tmp_path)
    cache = tmp_path / "cache"
    calls: list[tuple[int, int | None]] = []
    ds = load_dataset("tiny-imagenet", tmp_path, cache_dir=cache, progress=lambda d, t: calls.append((d, t)))
    assert calls == [(i, 9) for i in range(1, 10)]  # one running count over train then test
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 3 and ds.x_train.dtype == np.uint8
    assert len(ds.y_train) == 6 and ds.y_test.tolist() == [2, 1, 0]
    np.testing.assert_allclose(_red(ds.x_train), 40 * ds.y_train + 20, atol=4)
    np.testing.assert_allclose(_red(ds.x_test), 40 * ds.y_test + 20, atol=4)
    assert len(list(cache.glob("tiny-imagenet-*.npz"))) == 1
    again = load_dataset("tiny-imagenet", tmp_path, cache_dir=cache)
    np.testing.assert_array_equal(again.x_train, ds.x_train)


def test_tiny_imagenet_bad_annotations(tmp_path: Path) -> None:
    _tiny(tmp_path)
    (tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt").write_text("val_0.JPEG\tn99999999\n")
    with pytest.raises(DataError, match="known wnid"):
        load_dataset("tiny-imagenet", tmp_path)
    (tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt").write_text(f"gone.JPEG\t{WNIDS[0]}\n")
    with pytest.raises(DataError, match="listed but missing"):
        load_dataset("tiny-imagenet", tmp_path)


# --- CORe50 ----------------------------------------------------------------------------------------

OBJECTS = (1, 7, 50)  # categories 0, 1, 9


def _core50(root: Path, frames: int = 2) -> None:
    base = root / "core50_128x128"
    for session in CORE50_TRAIN_SESSIONS + CORE50_TEST_SESSIONS:
        for obj in OBJECTS:
            for frame in range(frames):
                name = f"C_{session:02d}_{obj:02d}_{frame:03d}.png"
                _image(base / f"s{session}" / f"o{obj}" / name, 128, 20 * ((obj - 1) // 5) + 30)


def test_core50_temporal_stream_and_iid(tmp_path: Path) -> None:
    _core50(tmp_path)
    ds = load_dataset("core50", tmp_path)
    assert ds.name == "core50" and ds.num_classes == 10 and ds.input_shape == (3, 32, 32)
    per_session = len(OBJECTS) * 2
    assert len(ds.y_train) == len(CORE50_TRAIN_SESSIONS) * per_session
    assert len(ds.y_test) == len(CORE50_TEST_SESSIONS) * per_session
    assert ds.y_train[:per_session].tolist() == [0, 0, 1, 1, 9, 9]  # object by object, frames in order
    np.testing.assert_allclose(_red(ds.x_train), 20 * ds.y_train + 30, atol=3)
    iid = load_dataset("core50-iid", tmp_path, seed=5)
    assert iid.name == "core50-iid"
    assert sorted(iid.y_train.tolist()) == sorted(ds.y_train.tolist())
    assert iid.y_train.tolist() != ds.y_train.tolist()
    np.testing.assert_array_equal(iid.y_test, ds.y_test)


def test_core50_missing_session(tmp_path: Path) -> None:
    _core50(tmp_path, frames=1)
    for image in (tmp_path / "core50_128x128" / "s7").rglob("*.png"):
        image.unlink()
    for folder in sorted((tmp_path / "core50_128x128" / "s7").rglob("*"), reverse=True):
        folder.rmdir()
    (tmp_path / "core50_128x128" / "s7").rmdir()
    with pytest.raises(DataError, match=r"missing session folders \['s7'\]"):
        load_dataset("core50", tmp_path)


# --- CLEAR -----------------------------------------------------------------------------------------


def _clear(
    root: Path, variant: str, buckets: int = 2, classes: tuple[str, ...] = ("bus", "camera"), per_class: int = 10
) -> None:
    for bucket in range(1, buckets + 1):
        for label, name in enumerate(classes):
            for i in range(per_class):
                path = root / variant / "labeled_images" / str(bucket) / name / f"{bucket}_{i}.jpg"
                _image(path, 48, 100 * label + 20, "JPEG")


def test_clear_time_buckets_are_tasks(tmp_path: Path) -> None:
    _clear(tmp_path, "clear10")
    ds = load_dataset("clear10", tmp_path, seed=0, cache_dir=tmp_path / "cache")
    assert ds.name == "clear10" and ds.input_shape == (3, 224, 224) and ds.num_classes == 2
    assert len(ds.y_train) == 28 and len(ds.y_test) == 12  # 70/30 of each (bucket, class)
    assert ds.tasks_train is not None and ds.tasks_test is not None
    assert ds.tasks_train.tolist() == [0] * 14 + [1] * 14
    assert np.bincount(ds.tasks_test).tolist() == [6, 6]
    for task in (0, 1):
        assert np.bincount(ds.y_test[ds.tasks_test == task]).tolist() == [3, 3]
    np.testing.assert_allclose(_red(ds.x_train), 100 * ds.y_train + 20, atol=4)
    assert [item.task for item in iter_stream(ds)] == ds.tasks_train.tolist()
    other = load_dataset("clear10", tmp_path, seed=1, cache_dir=tmp_path / "cache")
    assert other.y_train.tolist() != ds.y_train.tolist()
    assert len(list((tmp_path / "cache").glob("clear10-*.npz"))) == 1  # one decode serves every seed


def test_clear100_without_labeled_images_folder(tmp_path: Path) -> None:
    for bucket in ("1", "2", "10"):
        for name in ("apple", "zebra"):
            _image(tmp_path / "clear100" / bucket / name / "a.png", 16, 10)
    ds = load_dataset("clear100", tmp_path)
    assert ds.num_classes == 2 and ds.num_tasks == 3
    assert ds.tasks_train is not None and ds.tasks_train.tolist() == [0, 0, 1, 1, 2, 2]


def test_clear_without_classes(tmp_path: Path) -> None:
    (tmp_path / "clear10" / "labeled_images" / "1").mkdir(parents=True)
    with pytest.raises(DataError, match="no <class>/ folders"):
        load_dataset("clear10", tmp_path)
