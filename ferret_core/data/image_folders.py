"""Datasets stored as folders of image files: Tiny-ImageNet, CORe50 and CLEAR.

All three decode with Pillow, resize, and cache the decoded unshuffled arrays in ``cache_dir`` (see
:mod:`ferret_core.data.cache`). Layouts read:

Tiny-ImageNet (the official ``tiny-imagenet-200.zip``, extracted), resized 64→32::

    <root>/tiny-imagenet-200/train/<wnid>/images/*.JPEG
    <root>/tiny-imagenet-200/val/images/*.JPEG + val/val_annotations.txt  (file <TAB> wnid <TAB> box)

  classes = sorted wnids of ``train/`` (200); the labelled ``val`` split is the test split (the official
  test split has no labels). Train rows are shuffled with ``seed`` (the folders group by class).

CORe50 (``core50_128x128.zip``, extracted), resized 128→32::

    <root>/core50_128x128/s<session>/o<object>/*.png     (also <root>/core50/core50_128x128/...)

  10 categories, label = (object − 1) // 5 (objects 1–5 are category 0, …). The standard split: train
  sessions 1, 2, 4, 5, 6, 8, 9, 11, test sessions 3, 7, 10. ``core50`` streams session by session,
  object by object, frames in order (the temporally correlated stream); ``core50-iid`` is the same
  training set shuffled with ``seed``.

CLEAR-10 / CLEAR-100 (the public ``labeled_images`` release), resized to 224×224::

    <root>/<clear10|clear100>/labeled_images/<bucket>/<class>/*.{jpg,png}   (or without labeled_images/)

  buckets are the numbered time periods, ordered numerically; classes = sorted union of the class
  folder names (CLEAR-10 includes its ``BACKGROUND`` class). Each (bucket, class) folder is split 70/30
  into train/test with ``seed``; the stream runs bucket by bucket (shuffled within a bucket) and
  ``tasks_*`` hold the bucket ordinal. At 224×224×3 bytes per image the full CLEAR-10 is ≈ 5 GB.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from ferret_core.data.cache import cached_arrays, source_key
from ferret_core.data.dataset import Dataset, permute
from ferret_core.data.images import Progress, decode_files, list_images
from ferret_core.errors import DataError

TINY_SIZE = (32, 32)
CORE50_SIZE = (32, 32)
CLEAR_SIZE = (224, 224)
CORE50_TRAIN_SESSIONS = (1, 2, 4, 5, 6, 8, 9, 11)
CORE50_TEST_SESSIONS = (3, 7, 10)
CLEAR_TEST_FRACTION = 0.3


def _subdirs(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def _numbered(folder: Path, prefix: str) -> dict[int, Path]:
    pattern = re.compile(rf"{prefix}(\d+)")
    found: dict[int, Path] = {}
    for sub in _subdirs(folder):
        match = pattern.fullmatch(sub.name)
        if match:
            found[int(match.group(1))] = sub
    return found


# --- Tiny-ImageNet ---------------------------------------------------------------------------------


def load_tiny_imagenet(
    root: Path, *, seed: int = 0, cache_dir: Path | None = None, progress: Progress | None = None
) -> Dataset:
    """Tiny-ImageNet-200 as ``uint8 (N, 3, 32, 32)``: train (shuffled) and labelled val as test."""
    base = root / "tiny-imagenet-200"
    annotations = base / "val" / "val_annotations.txt"
    if not (base / "train").is_dir() or not annotations.is_file():
        raise DataError(
            f"Tiny-ImageNet not found: expected {base}/train/<wnid>/images/*.JPEG and {annotations} "
            f"under the data root {root}"
        )
    wnids = [d.name for d in _subdirs(base / "train")]
    index = {w: i for i, w in enumerate(wnids)}
    train_files: list[Path] = []
    train_labels: list[int] = []
    for wnid in wnids:
        folder = base / "train" / wnid / "images"
        files = list_images(folder) if folder.is_dir() else []
        train_files += files
        train_labels += [index[wnid]] * len(files)
    test_files: list[Path] = []
    test_labels: list[int] = []
    for line_no, line in enumerate(annotations.read_text().splitlines(), start=1):
        fields = line.split("\t")
        if not line.strip():
            continue
        if len(fields) < 2 or fields[1] not in index:
            raise DataError(f"{annotations}:{line_no}: expected '<file>\\t<wnid>…' with a known wnid, got {line!r}")
        test_files.append(base / "val" / "images" / fields[0])
        test_labels.append(index[fields[1]])
    missing = [str(p) for p in test_files if not p.is_file()]
    if missing:
        raise DataError(f"Tiny-ImageNet: {len(missing)} validation images listed but missing, e.g. {missing[0]}")

    n_all = len(train_files) + len(test_files)

    def build() -> dict[str, np.ndarray]:
        return {
            "x_train": decode_files(train_files, TINY_SIZE, progress, total=n_all),
            "y_train": np.array(train_labels, dtype=np.int64),
            "x_test": decode_files(test_files, TINY_SIZE, progress, start=len(train_files), total=n_all),
            "y_test": np.array(test_labels, dtype=np.int64),
        }

    arrays = cached_arrays(cache_dir, "tiny-imagenet", source_key(train_files + test_files, TINY_SIZE), build)
    ds = Dataset(
        "tiny-imagenet",
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        num_classes=len(wnids),
        input_shape=(3, *TINY_SIZE),
    )
    return permute(ds, seed, test=False)


# --- CORe50 ----------------------------------------------------------------------------------------


def _core50_base(root: Path) -> Path:
    for base in (root / "core50_128x128", root / "core50" / "core50_128x128"):
        if base.is_dir():
            return base
    raise DataError(
        f"CORe50 not found: expected {root / 'core50_128x128'}/s<1..11>/o<1..50>/*.png "
        f"(or {root / 'core50' / 'core50_128x128'}) under the data root {root}"
    )


def _core50_files(base: Path, sessions: tuple[int, ...]) -> tuple[list[Path], list[int]]:
    found = _numbered(base, "s")
    absent = [s for s in sessions if s not in found]
    if absent:
        raise DataError(f"CORe50: missing session folders {[f's{s}' for s in absent]} in {base}")
    files: list[Path] = []
    labels: list[int] = []
    for session in sessions:
        objects = _numbered(found[session], "o")
        for obj in sorted(objects):
            if not 1 <= obj <= 50:
                raise DataError(f"CORe50: object folder o{obj} in {found[session]} is outside o1…o50")
            frames = list_images(objects[obj])
            files += frames
            labels += [(obj - 1) // 5] * len(frames)
    return files, labels


def load_core50(
    root: Path,
    *,
    iid: bool = False,
    seed: int = 0,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> Dataset:
    """CORe50 (10 categories) as ``uint8 (N, 3, 32, 32)``; ``iid`` shuffles the training stream."""
    base = _core50_base(root)
    train_files, train_labels = _core50_files(base, CORE50_TRAIN_SESSIONS)
    test_files, test_labels = _core50_files(base, CORE50_TEST_SESSIONS)

    n_all = len(train_files) + len(test_files)

    def build() -> dict[str, np.ndarray]:
        return {
            "x_train": decode_files(train_files, CORE50_SIZE, progress, total=n_all),
            "y_train": np.array(train_labels, dtype=np.int64),
            "x_test": decode_files(test_files, CORE50_SIZE, progress, start=len(train_files), total=n_all),
            "y_test": np.array(test_labels, dtype=np.int64),
        }

    arrays = cached_arrays(cache_dir, "core50", source_key(train_files + test_files, CORE50_SIZE), build)
    ds = Dataset(
        "core50-iid" if iid else "core50",
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        num_classes=10,
        input_shape=(3, *CORE50_SIZE),
    )
    return permute(ds, seed, test=False) if iid else ds


# --- CLEAR -----------------------------------------------------------------------------------------


def load_clear(
    root: Path,
    variant: str,
    *,
    seed: int = 0,
    cache_dir: Path | None = None,
    progress: Progress | None = None,
) -> Dataset:
    """CLEAR-10 / CLEAR-100 (``variant`` = ``clear10`` | ``clear100``) as ``uint8 (N, 3, 224, 224)``."""
    if variant not in ("clear10", "clear100"):
        raise DataError(f"unknown CLEAR variant {variant!r}: expected 'clear10' or 'clear100'")
    base = root / variant / "labeled_images"
    if not base.is_dir():
        base = root / variant
    buckets = _numbered(base, "") if base.is_dir() else {}
    if not buckets:
        raise DataError(
            f"CLEAR not found: expected {root / variant}/labeled_images/<bucket>/<class>/*.jpg "
            f"(numbered time buckets) under the data root {root}"
        )
    classes = sorted({c.name for b in buckets.values() for c in _subdirs(b)})
    if not classes:
        raise DataError(f"CLEAR: the time buckets in {base} hold no <class>/ folders")
    files: list[Path] = []
    groups: list[tuple[int, np.ndarray]] = []  # (task, row indices of one (bucket, class) folder)
    labels: list[int] = []
    for task, bucket in enumerate(sorted(buckets)):
        for label, name in enumerate(classes):
            folder = buckets[bucket] / name
            found = list_images(folder) if folder.is_dir() else []
            groups.append((task, np.arange(len(files), len(files) + len(found))))
            files += found
            labels += [label] * len(found)

    def build() -> dict[str, np.ndarray]:
        return {"x": decode_files(files, CLEAR_SIZE, progress)}

    x = cached_arrays(cache_dir, variant, source_key(files, CLEAR_SIZE), build)["x"]
    rng = np.random.default_rng(seed)
    train_rows: list[np.ndarray] = []
    test_rows: list[np.ndarray] = []
    for task in range(len(buckets)):
        bucket_train: list[np.ndarray] = []
        for group_task, rows in groups:
            if group_task != task:
                continue
            shuffled = rows[rng.permutation(len(rows))]
            n_test = round(len(rows) * CLEAR_TEST_FRACTION)
            test_rows.append(np.sort(shuffled[:n_test]))
            bucket_train.append(shuffled[n_test:])
        joined = np.concatenate(bucket_train) if bucket_train else np.empty(0, np.int64)
        train_rows.append(joined[rng.permutation(len(joined))])
    tr = np.concatenate(train_rows).astype(np.int64)
    te = np.concatenate(test_rows).astype(np.int64)
    y = np.array(labels, dtype=np.int64)
    task_of = np.empty(len(files), dtype=np.int64)
    for task, rows in groups:
        task_of[rows] = task
    return Dataset(
        variant,
        x[tr],
        y[tr],
        x[te],
        y[te],
        num_classes=len(classes),
        input_shape=(3, *CLEAR_SIZE),
        tasks_train=task_of[tr],
        tasks_test=task_of[te],
    )
