"""IDX readers: MNIST, Fashion-MNIST and EMNIST in torchvision's on-disk layout.

Layouts (``.gz`` or uncompressed, whichever exists)::

    <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    <root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]
    <root>/EMNIST/raw/emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]
        (also accepted: <root>/EMNIST/raw/gzip/ and <root>/EMNIST/gzip/, as the EMNIST zip unpacks)

Every file's IDX header (magic, dtype, rank, sizes) is checked; MNIST's uncompressed content is also
checked against the published md5s. Samples keep the published order (no shuffling) and are stored as
``uint8 (N, 1, 28, 28)``. EMNIST's images are stored transposed in the published files; they are
transposed back so that they look like MNIST's.
"""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from ferret_core.data.dataset import Dataset
from ferret_core.errors import DataError

# md5 of the *uncompressed* MNIST files (data/README.md; the .gz files here were recompressed).
MNIST_MD5 = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}

EMNIST_CLASSES = {"balanced": 47, "byclass": 62, "bymerge": 47, "digits": 10, "mnist": 10}

_IDX_DTYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _find_all(folders: list[Path], stems: list[str], root: Path) -> dict[str, Path]:
    """Each IDX file (plain or ``.gz``) from the first folder that has it; all missing ones reported."""
    found: dict[str, Path] = {}
    for stem in stems:
        for candidate in (f / name for f in folders for name in (stem, f"{stem}.gz")):
            if candidate.is_file():
                found[stem] = candidate
                break
    missing = [stem for stem in stems if stem not in found]
    if missing:
        where = " or ".join(f"{folder}/" for folder in folders)
        raise DataError(
            f"missing IDX files {', '.join(f'{m}[.gz]' for m in missing)}: expected them in {where} (data root {root})"
        )
    return found


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc


def parse_idx(raw: bytes, source: str = "<bytes>") -> np.ndarray:
    """Decode an IDX file's bytes (header: 0x00 0x00 dtype rank, then rank big-endian int32 sizes)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{source}: not an IDX file (bad magic {raw[:4].hex() or 'empty'})")
    dtype = _IDX_DTYPES[raw[2]]
    rank = raw[3]
    header = 4 + 4 * rank
    if len(raw) < header:
        raise DataError(f"{source}: truncated IDX header")
    shape = tuple(int(v) for v in np.frombuffer(raw, dtype=">i4", count=rank, offset=4))
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(f"{source}: IDX header says shape {shape} ({expected} bytes), got {len(raw) - header} bytes")
    array: np.ndarray = np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def read_idx(path: Path, md5: str | None = None) -> np.ndarray:
    """Read one IDX file (``.gz`` or plain); check the uncompressed content's md5 when given."""
    raw = _read_bytes(path)
    if md5 is not None and hashlib.md5(raw).hexdigest() != md5:
        raise DataError(
            f"{path}: uncompressed md5 {hashlib.md5(raw).hexdigest()} does not match the published {md5}; "
            "the file is corrupt or not the expected dataset"
        )
    return parse_idx(raw, str(path))


def _pair(images: Path, labels: Path, check_md5: bool) -> tuple[np.ndarray, np.ndarray]:
    x = read_idx(images, MNIST_MD5.get(images.name.removesuffix(".gz")) if check_md5 else None)
    y = read_idx(labels, MNIST_MD5.get(labels.name.removesuffix(".gz")) if check_md5 else None)
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.dtype != np.uint8:
        raise DataError(
            f"{images} / {labels}: expected uint8 images (N, H, W) and N labels, got {x.dtype} {x.shape} and {y.shape}"
        )
    return x[:, None, :, :], y.astype(np.int64)


def _splits(
    folders: list[Path], prefix: str, names: tuple[str, str], root: Path, check_md5: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``x_train, y_train, x_test, y_test`` from ``<prefix><split>-{images-idx3,labels-idx1}-ubyte``."""
    stems = [f"{prefix}{split}-{kind}-ubyte" for split in names for kind in ("images-idx3", "labels-idx1")]
    paths = _find_all(folders, stems, root)
    x_tr, y_tr = _pair(paths[stems[0]], paths[stems[1]], check_md5)
    x_te, y_te = _pair(paths[stems[2]], paths[stems[3]], check_md5)
    return x_tr, y_tr, x_te, y_te


def _load_mnist_like(name: str, folder: str, root: Path, *, check_md5: bool) -> Dataset:
    x_tr, y_tr, x_te, y_te = _splits([root / folder / "raw"], "", ("train", "t10k"), root, check_md5)
    return Dataset(name, x_tr, y_tr, x_te, y_te, num_classes=10, input_shape=tuple(x_tr.shape[1:]))


def load_mnist(root: Path) -> Dataset:
    """MNIST from ``<root>/MNIST/raw/`` (content checked against the published md5s)."""
    return _load_mnist_like("mnist", "MNIST", root, check_md5=True)


def load_fashion_mnist(root: Path) -> Dataset:
    """Fashion-MNIST from ``<root>/FashionMNIST/raw/`` (IDX headers checked)."""
    return _load_mnist_like("fashion-mnist", "FashionMNIST", root, check_md5=False)


def load_emnist(root: Path, split: str = "balanced") -> Dataset:
    """EMNIST ``split`` (default ``balanced``: 47 classes) from torchvision's ``<root>/EMNIST/raw/``."""
    if split not in EMNIST_CLASSES:
        raise DataError(f"unknown EMNIST split {split!r}: expected one of {sorted(EMNIST_CLASSES)}")
    folders = [root / "EMNIST" / "raw", root / "EMNIST" / "raw" / "gzip", root / "EMNIST" / "gzip"]
    x_tr, y_tr, x_te, y_te = _splits(folders, f"emnist-{split}-", ("train", "test"), root, False)
    x_tr = np.ascontiguousarray(x_tr.transpose(0, 1, 3, 2))
    x_te = np.ascontiguousarray(x_te.transpose(0, 1, 3, 2))
    return Dataset(
        "emnist", x_tr, y_tr, x_te, y_te, num_classes=EMNIST_CLASSES[split], input_shape=tuple(x_tr.shape[1:])
    )
