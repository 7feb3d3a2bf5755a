"""CIFAR-100 from the standard python pickles, read with an allow-list unpickler.

Layout (the official ``cifar-100-python.tar.gz``, extracted or not)::

    <root>/cifar-100-python/{train,test}       (dict: b"data" uint8 (N, 3072), b"fine_labels")
    or <root>/cifar-100-python.tar.gz          (read in place)

The pickles are read with an unpickler that only rebuilds numpy arrays and builtin containers, so a
tampered file cannot run code. Samples keep the published order; ``uint8 (N, 3, 32, 32)``, 100 fine
classes.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from ferret_core.data.dataset import Dataset
from ferret_core.errors import DataError

FOLDER = "cifar-100-python"
ARCHIVE = "cifar-100-python.tar.gz"

_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
    ("builtins", "bytearray"),
}


class _ArraysOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a dataset pickle")
        return super().find_class(module, name)


def load_pickle(raw: bytes, source: str) -> dict[bytes, Any]:
    """Unpickle a CIFAR batch (latin-1/bytes keys) allowing only numpy arrays and builtins."""
    try:
        value = _ArraysOnlyUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise DataError(f"{source}: not a CIFAR python pickle ({exc})") from exc
    if not isinstance(value, dict):
        raise DataError(f"{source}: expected a dict, got {type(value).__name__}")
    return value


def _batch(value: dict[bytes, Any], source: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        data = np.asarray(value[b"data"], dtype=np.uint8)
        labels = np.asarray(value[b"fine_labels"], dtype=np.int64)
    except KeyError as exc:
        raise DataError(f"{source}: missing key {exc.args[0]!r} (expected b'data' and b'fine_labels')") from exc
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or data.shape[0] != labels.shape[0]:
        raise DataError(f"{source}: expected data (N, 3072) and N labels, got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32).copy(), labels


def _read_split(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    plain = root / FOLDER / split
    if plain.is_file():
        return _batch(load_pickle(plain.read_bytes(), str(plain)), str(plain))
    archive = root / ARCHIVE
    if archive.is_file():
        try:
            with tarfile.open(archive, "r:*") as tar:
                handle = tar.extractfile(f"{FOLDER}/{split}")
                if handle is None:
                    raise KeyError(split)
                raw = handle.read()
        except (KeyError, tarfile.TarError, OSError) as exc:
            raise DataError(f"{archive}: cannot read member {FOLDER}/{split} ({exc})") from exc
        return _batch(load_pickle(raw, f"{archive}:{split}"), f"{archive}:{split}")
    raise DataError(
        f"CIFAR-100 not found: expected {plain} (the extracted {ARCHIVE}) or {archive} under the data root {root}"
    )


def load_cifar100(root: Path) -> Dataset:
    """CIFAR-100 (fine labels) as ``uint8 (N, 3, 32, 32)`` in the published order."""
    x_tr, y_tr = _read_split(root, "train")
    x_te, y_te = _read_split(root, "test")
    return Dataset("cifar100", x_tr, y_tr, x_te, y_te, num_classes=100, input_shape=(3, 32, 32))
