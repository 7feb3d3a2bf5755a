"""CIFAR-10 (JPEG q75) read straight from its tar archive, with the decoded arrays cached as ``.npz``.

Layout (data/README.md)::

    <root>/CIFAR10-jpeg-q75.tar.gz   members train/<class>/NNNN.jpg, test/<class>/NNNN.jpg (+ README.md)
    or, extracted: <root>/CIFAR10-jpeg-q75/{train,test}/<class>/*.jpg

Class folders sorted alphabetically are the standard CIFAR-10 label order (airplane = 0 … truck = 9);
the loader checks the class names. Files are grouped by class, so :func:`load_cifar10` shuffles both
splits with ``seed``; the cache holds the unshuffled arrays (one entry serves every seed). Pixels are
JPEG-approximate: call it "CIFAR-10 (JPEG q75)" in reports.
"""

from __future__ import annotations

import tarfile
from pathlib import Path, PurePosixPath

import numpy as np

from ferret_core.data.cache import cached_arrays, source_key
from ferret_core.data.dataset import Dataset, permute
from ferret_core.data.images import Progress, decode_image, list_images
from ferret_core.errors import DataError

ARCHIVE = "CIFAR10-jpeg-q75.tar.gz"
FOLDER = "CIFAR10-jpeg-q75"
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
SPLITS = ("train", "test")
_SIZE = (32, 32)


def _member_key(name: str) -> tuple[str, str, str] | None:
    """``(split, class, file)`` for an image member (any leading folders allowed), else None."""
    parts = PurePosixPath(name).parts
    if len(parts) < 3 or parts[-3] not in SPLITS or not parts[-1].lower().endswith((".jpg", ".jpeg")):
        return None
    return parts[-3], parts[-2], parts[-1]


def _assemble(found: dict[tuple[str, str, str], np.ndarray], source: Path) -> dict[str, np.ndarray]:
    arrays: dict[str, np.ndarray] = {}
    for split in SPLITS:
        keys = sorted(k for k in found if k[0] == split)
        classes = sorted({k[1] for k in keys})
        if tuple(classes) != CLASSES:
            raise DataError(
                f"{source}: expected {split}/<class>/ folders for the 10 CIFAR-10 classes {list(CLASSES)}, "
                f"got {classes}"
            )
        arrays[f"x_{split}"] = np.stack([found[k] for k in keys]) if keys else np.empty((0, 3, *_SIZE), np.uint8)
        arrays[f"y_{split}"] = np.array([CLASSES.index(k[1]) for k in keys], dtype=np.int64)
    return arrays


def read_cifar10_tar(path: Path, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Decode every image member of the tar, in (split, class, file name) order, unshuffled."""
    found: dict[tuple[str, str, str], np.ndarray] = {}
    try:
        with tarfile.open(path, "r|*") as archive:
            for member in archive:
                key = _member_key(member.name) if member.isfile() else None
                if key is None:
                    continue
                handle = archive.extractfile(member)
                if handle is None:
                    continue
                found[key] = decode_image(handle.read(), _SIZE, source=f"{path}:{member.name}")
                if progress is not None:
                    progress(len(found), None)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot read the CIFAR-10 archive {path}: {exc}") from exc
    return _assemble(found, path)


def read_cifar10_folder(folder: Path, progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Decode an extracted copy ``<folder>/{train,test}/<class>/*.jpg``, unshuffled."""
    found: dict[tuple[str, str, str], np.ndarray] = {}
    for split in SPLITS:
        split_dir = folder / split
        if not split_dir.is_dir():
            raise DataError(f"{folder}: missing the {split}/ folder of the extracted CIFAR-10 archive")
        for class_dir in sorted(p for p in split_dir.iterdir() if p.is_dir()):
            for image in list_images(class_dir):
                found[(split, class_dir.name, image.name)] = decode_image(image.read_bytes(), _SIZE, source=str(image))
                if progress is not None:
                    progress(len(found), None)
    return _assemble(found, folder)


def load_cifar10(
    root: Path, *, seed: int = 0, cache_dir: Path | None = None, progress: Progress | None = None
) -> Dataset:
    """CIFAR-10 (JPEG q75) as ``uint8 (N, 3, 32, 32)``, both splits shuffled with ``seed``."""
    archive, folder = root / ARCHIVE, root / FOLDER
    if archive.is_file():
        key = source_key([archive])
        arrays = cached_arrays(cache_dir, "cifar10-jpeg-q75", key, lambda: read_cifar10_tar(archive, progress))
    elif folder.is_dir():
        files = [p for p in folder.rglob("*") if p.is_file()]
        key = source_key(files)
        arrays = cached_arrays(cache_dir, "cifar10-jpeg-q75", key, lambda: read_cifar10_folder(folder, progress))
    else:
        raise DataError(
            f"CIFAR-10 (JPEG q75) not found: expected {archive} (or its extracted folder {folder}/"
            f"{{train,test}}/<class>/*.jpg) under the data root {root}"
        )
    ds = Dataset(
        "cifar10",
        arrays["x_train"],
        arrays["y_train"],
        arrays["x_test"],
        arrays["y_test"],
        num_classes=len(CLASSES),
        input_shape=(3, *_SIZE),
    )
    return permute(ds, seed)
